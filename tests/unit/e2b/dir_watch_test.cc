// DirWatch over an in-memory tree: the events of each poll are the
// difference of two listings, names relative to the watched directory.
#include "e2b/dir_watch.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "status_matchers.h"

namespace warren::e2b {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// A tree of paths ("/a/b") -> entries; List answers the direct children.
class TreeFiles final : public runtime::SandboxFiles {
 public:
  void Put(const std::string& path, runtime::FileType type, uint64_t size = 0, uint32_t mode = 0644,
           int64_t mtime = 1) {
    runtime::FileInfo fi;
    fi.path = path;
    fi.name = path.substr(path.rfind('/') + 1);
    fi.type = type;
    fi.size = size;
    fi.mode = mode;
    fi.mtime_ns = mtime;
    tree_[path] = fi;
  }
  void Erase(const std::string& path) {
    for (auto it = tree_.begin(); it != tree_.end();) {
      it = it->first == path || it->first.rfind(path + "/", 0) == 0 ? tree_.erase(it) : std::next(it);
    }
  }
  int lists = 0;

  StatusOr<std::vector<runtime::FileInfo>> List(const std::string& path) override {
    ++lists;
    if (!tree_.count(path)) return absl::NotFoundError("open(" + path + "): ENOENT");
    std::vector<runtime::FileInfo> out;
    for (const auto& [p, fi] : tree_) {
      if (p.rfind(path + "/", 0) == 0 && p.find('/', path.size() + 1) == std::string::npos) out.push_back(fi);
    }
    return out;
  }
  StatusOr<runtime::FileInfo> Stat(const std::string& path) override {
    auto it = tree_.find(path);
    if (it == tree_.end()) return absl::NotFoundError("stat(" + path + "): ENOENT");
    return it->second;
  }
  StatusOr<std::unique_ptr<runtime::FileWriter>> OpenWrite(const std::string&, uint32_t, bool) override {
    return absl::UnimplementedError("");
  }
  StatusOr<std::unique_ptr<runtime::FileReader>> OpenRead(const std::string&, uint64_t, uint64_t) override {
    return absl::UnimplementedError("");
  }
  Status Mkdir(const std::string&, uint32_t, bool) override { return absl::UnimplementedError(""); }
  Status Remove(const std::string&, bool) override { return absl::UnimplementedError(""); }
  Status Rename(const std::string&, const std::string&) override { return absl::UnimplementedError(""); }

 private:
  std::map<std::string, runtime::FileInfo> tree_;
};

std::vector<std::pair<std::string, std::string>> Names(const std::vector<WatchEvent>& events) {
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(events.size());
  for (const WatchEvent& e : events) out.emplace_back(e.name, WatchEventTypeName(e.type));
  return out;
}

TEST(DirWatch, ReportsTheDifferenceSinceTheLastPoll) {
  TreeFiles fs;
  fs.Put("/w", runtime::FileType::kDirectory);
  fs.Put("/w/keep", runtime::FileType::kRegular, 1);
  fs.Put("/w/gone", runtime::FileType::kRegular, 1);
  fs.Put("/w/sub", runtime::FileType::kDirectory);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DirWatch> deep, DirWatch::Start(fs, "/w", /*recursive=*/true));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DirWatch> flat, DirWatch::Start(fs, "/w", /*recursive=*/false));
  ASSERT_OK_AND_ASSIGN(std::vector<WatchEvent> none, deep->Poll(fs));
  EXPECT_THAT(none, IsEmpty());

  fs.Put("/w/keep", runtime::FileType::kRegular, 2, 0600, 2);  // written and chmod'ed
  fs.Erase("/w/gone");
  fs.Put("/w/new", runtime::FileType::kRegular);
  fs.Put("/w/sub/deep", runtime::FileType::kRegular);
  ASSERT_OK_AND_ASSIGN(std::vector<WatchEvent> d, deep->Poll(fs));
  EXPECT_THAT(Names(d), ElementsAre(std::pair<std::string, std::string>{"gone", "EVENT_TYPE_REMOVE"},
                                    std::pair<std::string, std::string>{"keep", "EVENT_TYPE_CHMOD"},
                                    std::pair<std::string, std::string>{"keep", "EVENT_TYPE_WRITE"},
                                    std::pair<std::string, std::string>{"new", "EVENT_TYPE_CREATE"},
                                    std::pair<std::string, std::string>{"sub/deep", "EVENT_TYPE_CREATE"}));
  ASSERT_OK_AND_ASSIGN(std::vector<WatchEvent> f, flat->Poll(fs));
  EXPECT_EQ(f.size(), 4u);  // not sub/deep
  ASSERT_OK_AND_ASSIGN(std::vector<WatchEvent> again, deep->Poll(fs));
  EXPECT_THAT(again, IsEmpty());

  // A file replaced by a directory of the same name: removed, then created.
  fs.Erase("/w/new");
  fs.Put("/w/new", runtime::FileType::kDirectory);
  ASSERT_OK_AND_ASSIGN(std::vector<WatchEvent> swapped, deep->Poll(fs));
  EXPECT_THAT(Names(swapped), ElementsAre(std::pair<std::string, std::string>{"new", "EVENT_TYPE_REMOVE"},
                                          std::pair<std::string, std::string>{"new", "EVENT_TYPE_CREATE"}));
  EXPECT_EQ(swapped[1].info.type, runtime::FileType::kDirectory);
}

TEST(DirWatch, NamesWhatCannotBeWatched) {
  TreeFiles fs;
  fs.Put("/w", runtime::FileType::kDirectory);
  fs.Put("/w/f", runtime::FileType::kRegular);
  EXPECT_THAT(DirWatch::Start(fs, "/nope", false), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(DirWatch::Start(fs, "/w/f", false),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("/w/f is not a directory")));
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<DirWatch> w, DirWatch::Start(fs, "/w", true));
  fs.Erase("/w");
  EXPECT_THAT(w->Poll(fs), StatusIs(absl::StatusCode::kNotFound, ::testing::HasSubstr("/w was removed")));
}

TEST(WatcherTable, WatchersBelongToTheirSandboxAndAreBounded) {
  WatcherTable t;
  ASSERT_OK_AND_ASSIGN(std::string a, t.Add("sb-a", std::make_shared<WatcherTable::Watcher>()));
  EXPECT_EQ(a.size(), 25u);  // "w" + 24 hex digits
  EXPECT_OK(t.Find("sb-a", a).status());
  EXPECT_THAT(t.Find("sb-b", a), StatusIs(absl::StatusCode::kNotFound));  // another sandbox's id
  EXPECT_THAT(t.Remove("sb-b", a), StatusIs(absl::StatusCode::kNotFound));
  for (size_t i = 1; i < WatcherTable::kMaxPerSandbox; ++i) {
    EXPECT_OK(t.Add("sb-a", std::make_shared<WatcherTable::Watcher>()).status());
  }
  EXPECT_THAT(t.Add("sb-a", std::make_shared<WatcherTable::Watcher>()), StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_OK(t.Add("sb-b", std::make_shared<WatcherTable::Watcher>()).status());
  t.Drop("sb-a");
  EXPECT_THAT(t.Find("sb-a", a), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_OK(t.Add("sb-a", std::make_shared<WatcherTable::Watcher>()).status());
}

}  // namespace
}  // namespace warren::e2b

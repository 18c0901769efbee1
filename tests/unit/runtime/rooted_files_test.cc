#include "runtime/container/rooted_files.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "status_matchers.h"

namespace warren::runtime {
namespace internal {
void SetForceWalkResolverForTest(bool force);
}  // namespace internal

namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAreArray;

std::string RandomTag() {
  std::random_device rd;
  std::ostringstream s;
  s << std::hex << rd() << rd();
  return s.str();
}

bool HostExists(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0;
}

std::string HostRead(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void HostWrite(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << data;
  ASSERT_TRUE(out.good()) << path;
}

// Deterministic byte stream: any split into slices yields the same bytes.
class Pattern {
 public:
  explicit Pattern(uint64_t seed) : x_(seed * 0x9E3779B97F4A7C15ull + 1) {}
  std::string Next(size_t n) {
    std::string out(n, '\0');
    for (size_t i = 0; i < n; ++i) {
      x_ ^= x_ << 13;
      x_ ^= x_ >> 7;
      x_ ^= x_ << 17;
      out[i] = static_cast<char>(x_ >> 56);
    }
    return out;
  }

 private:
  uint64_t x_;
};

class RootedFilesTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    internal::SetForceWalkResolverForTest(GetParam());
    char tmpl[] = "/tmp/warren-rooted-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    tag_ = RandomTag();
    ASSERT_EQ(mkdir((root_ + "/w").c_str(), 0755), 0);
    ASSERT_EQ(mkdir((root_ + "/etc").c_str(), 0755), 0);
    HostWrite(root_ + "/etc/hostname", "sandbox-hostname\n");
    ASSERT_EQ(symlink("/", (root_ + "/escape").c_str()), 0);
    ASSERT_EQ(symlink("/etc", (root_ + "/etc-link").c_str()), 0);
    ASSERT_EQ(symlink("../../..", (root_ + "/w/up").c_str()), 0);
    files_ = Make(root_, 0, 0);
  }

  void TearDown() override {
    internal::SetForceWalkResolverForTest(false);
    for (const std::string& m : mounts_) EXPECT_EQ(umount2(m.c_str(), MNT_DETACH), 0) << m;
    for (const std::string& p : host_cleanup_) fs::remove_all(p);
    if (!root_.empty()) fs::remove_all(root_);
  }

  static std::unique_ptr<SandboxFiles> Make(const std::string& dir, uid_t uid, gid_t gid) {
    RootedFilesOptions opt;
    opt.open_root = [dir]() -> StatusOr<UniqueFd> {
      UniqueFd fd(open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
      if (!fd.valid()) return ErrnoToStatus(errno, "open(" + dir + ")");
      return fd;
    };
    opt.host_root_uid = uid;
    opt.host_root_gid = gid;
    return NewRootedFiles(std::move(opt));
  }

  Status WriteFile(SandboxFiles& files, const std::string& path, const std::string& data, bool make_parents = false,
                   uint32_t mode = 0644) {
    ASSIGN_OR_RETURN(auto w, files.OpenWrite(path, mode, make_parents));
    RETURN_IF_ERROR(w->Write(data));
    ASSIGN_OR_RETURN(uint64_t n, w->Commit());
    EXPECT_EQ(n, data.size());
    return absl::OkStatus();
  }
  Status WriteFile(const std::string& path, const std::string& data, bool make_parents = false) {
    return WriteFile(*files_, path, data, make_parents);
  }

  StatusOr<std::string> ReadFile(const std::string& path, size_t chunk = 1 << 20) {
    ASSIGN_OR_RETURN(auto r, files_->OpenRead(path, 0, 0));
    std::string out;
    for (int i = 0; i < 1 << 20; ++i) {
      ASSIGN_OR_RETURN(std::string part, r->Read(chunk));
      if (part.empty()) return out;
      EXPECT_LE(part.size(), chunk);
      out += part;
    }
    return absl::InternalError("read did not end");
  }

  std::string HostTmp(const std::string& name) {
    host_cleanup_.push_back("/tmp/" + name);
    return "/tmp/" + name;
  }

  std::string root_, tag_;
  std::unique_ptr<SandboxFiles> files_;
  std::vector<std::string> host_cleanup_;
  std::vector<std::string> mounts_;  // unmounted by TearDown, before the tree is removed
};

TEST_P(RootedFilesTest, TraversalNeverLeavesTheRoot) {
  const std::string pwned = "pwned-" + tag_;
  const std::string host_pwned = HostTmp(pwned);
  const std::string host_pwned2 = HostTmp(pwned + "-2");
  const std::string host_etc = "/etc/warren-pwned-" + tag_;
  host_cleanup_.push_back(host_etc);
  ASSERT_FALSE(HostExists(host_pwned));

  // Without make_parents the sandbox has no /tmp: NotFound, nothing created.
  Status s = WriteFile("../../tmp/" + pwned, "x");
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(std::string(s.message()), HasSubstr("../../tmp/" + pwned));

  EXPECT_OK(WriteFile("../../tmp/" + pwned, "a", true));
  EXPECT_EQ(HostRead(root_ + "/tmp/" + pwned), "a");
  EXPECT_OK(WriteFile("/w/../../../../tmp/" + pwned, "b"));
  EXPECT_EQ(HostRead(root_ + "/tmp/" + pwned), "b");
  EXPECT_OK(WriteFile("/escape/tmp/" + pwned, "c"));
  EXPECT_EQ(HostRead(root_ + "/tmp/" + pwned), "c");
  EXPECT_OK(WriteFile("/w/up/tmp/" + pwned + "-2", "d"));
  EXPECT_EQ(HostRead(root_ + "/tmp/" + pwned + "-2"), "d");
  EXPECT_OK(WriteFile("/etc-link/warren-pwned-" + tag_, "e"));
  EXPECT_EQ(HostRead(root_ + "/etc/warren-pwned-" + tag_), "e");
  EXPECT_OK(WriteFile("..%2f..%2ftmp%2f" + pwned, "f"));
  EXPECT_EQ(HostRead(root_ + "/..%2f..%2ftmp%2f" + pwned), "f");
  EXPECT_OK(files_->Mkdir("/escape/tmp/d-" + tag_ + "/e", 0755, true));
  EXPECT_TRUE(HostExists(root_ + "/tmp/d-" + tag_ + "/e"));
  EXPECT_OK(files_->Rename("/tmp/" + pwned, "/escape/../../tmp/" + pwned + "-moved"));
  EXPECT_EQ(HostRead(root_ + "/tmp/" + pwned + "-moved"), "c");

  EXPECT_FALSE(HostExists(host_pwned));
  EXPECT_FALSE(HostExists(host_pwned2));
  EXPECT_FALSE(HostExists(host_pwned + "-moved"));
  EXPECT_FALSE(HostExists("/tmp/d-" + tag_));
  EXPECT_FALSE(HostExists(host_etc));
  EXPECT_FALSE(HostExists("/tmp/..%2f..%2ftmp%2f" + pwned));
}

TEST_P(RootedFilesTest, FinalSymlinkIsReplacedNotFollowed) {
  const std::string host_file = HostTmp("warren-hostfile-" + tag_);
  HostWrite(host_file, "host");
  ASSERT_EQ(symlink(host_file.c_str(), (root_ + "/w/link").c_str()), 0);
  ASSERT_OK(WriteFile("/w/link", "sandbox"));
  EXPECT_EQ(HostRead(host_file), "host");
  struct stat st;
  ASSERT_EQ(lstat((root_ + "/w/link").c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(HostRead(root_ + "/w/link"), "sandbox");
  // Removing a symlink to a host file removes the link only.
  ASSERT_EQ(symlink(host_file.c_str(), (root_ + "/w/link2").c_str()), 0);
  ASSERT_OK(files_->Remove("/w/link2", false));
  EXPECT_FALSE(HostExists(root_ + "/w/link2"));
  EXPECT_EQ(HostRead(host_file), "host");
}

TEST_P(RootedFilesTest, ReadsResolveInsideTheRoot) {
  StatusOr<std::string> got = ReadFile("/escape/etc/hostname");
  ASSERT_OK(got);
  EXPECT_EQ(*got, "sandbox-hostname\n");
  got = ReadFile("/etc-link/hostname");
  ASSERT_OK(got);
  EXPECT_EQ(*got, "sandbox-hostname\n");
  got = ReadFile("/w/up/w/up/../etc/hostname");
  ASSERT_OK(got);
  EXPECT_EQ(*got, "sandbox-hostname\n");
  // A final symlink is followed for reads, inside the root.
  ASSERT_EQ(symlink("/etc/hostname", (root_ + "/w/hn").c_str()), 0);
  got = ReadFile("/w/hn");
  ASSERT_OK(got);
  EXPECT_EQ(*got, "sandbox-hostname\n");
  // The host has /etc/passwd, the sandbox root does not.
  got = ReadFile("../../../etc/passwd");
  ASSERT_THAT(got, ::testing::Not(IsOk()));
  EXPECT_THAT(got, StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(std::string(got.status().message()), HasSubstr("../../../etc/passwd"));
  // Magic links are refused (openat2) or absent (the walk): never the host's root.
  ASSERT_EQ(symlink("/proc/self/root/etc/passwd", (root_ + "/w/magic").c_str()), 0);
  got = ReadFile("/w/magic");
  EXPECT_THAT(got, ::testing::Not(IsOk()));
}

TEST_P(RootedFilesTest, SizesRoundTripByteExact) {
  const size_t sizes[] = {0, 1000, 17000, 19000, 65535, 65536, 65537, 1000000};
  for (size_t size : sizes) {
    std::string data = Pattern(size).Next(size);
    std::string path = "/w/f-" + std::to_string(size);
    ASSERT_OK(WriteFile(path, data)) << size;
    EXPECT_EQ(HostRead(root_ + path), data) << size;
    StatusOr<std::string> got = ReadFile(path, 65536);
    ASSERT_OK(got);
    EXPECT_TRUE(*got == data) << "size " << size << " got " << got->size();
  }
}

TEST_P(RootedFilesTest, HundredMegabytesStreamedInChunks) {
  constexpr size_t kChunk = 1 << 20;
  constexpr size_t kTotal = 100 * kChunk;
  auto w = files_->OpenWrite("/w/big", 0600, false);
  ASSERT_OK(w);
  Pattern out(100);
  for (size_t done = 0; done < kTotal; done += kChunk) ASSERT_OK((*w)->Write(out.Next(kChunk)));
  // Not visible before Commit.
  EXPECT_FALSE(HostExists(root_ + "/w/big"));
  StatusOr<uint64_t> n = (*w)->Commit();
  ASSERT_OK(n);
  EXPECT_EQ(*n, kTotal);
  auto r = files_->OpenRead("/w/big", 0, 0);
  ASSERT_OK(r);
  Pattern in(100);
  size_t total = 0;
  for (int i = 0; i < 1000; ++i) {
    StatusOr<std::string> part = (*r)->Read(kChunk);
    ASSERT_OK(part);
    if (part->empty()) break;
    ASSERT_TRUE(*part == in.Next(part->size())) << "mismatch at " << total;
    total += part->size();
  }
  EXPECT_EQ(total, kTotal);
}

TEST_P(RootedFilesTest, BinaryIsByteExactAndRangesWork) {
  std::string data;
  for (int rep = 0; rep < 4096; ++rep) {
    for (int b = 0; b < 256; ++b) data.push_back(static_cast<char>(b));
  }
  ASSERT_OK(WriteFile("/w/bin", data));
  StatusOr<std::string> got = ReadFile("/w/bin", 4097);
  ASSERT_OK(got);
  EXPECT_TRUE(*got == data);
  auto r = files_->OpenRead("/w/bin", 1000, 500);
  ASSERT_OK(r);
  StatusOr<std::string> part = (*r)->Read(1 << 20);
  ASSERT_OK(part);
  EXPECT_EQ(*part, data.substr(1000, 500));
  part = (*r)->Read(1 << 20);
  ASSERT_OK(part);
  EXPECT_EQ(*part, "");
}

TEST_P(RootedFilesTest, ListReturnsNamesByteExact) {
  const std::vector<std::string> names = {"\xff\xfe", "a\nb", "\xc3\xa9", "plain", " sp ", "\x80"};
  for (size_t i = 0; i + 1 < names.size(); ++i) HostWrite(root_ + "/w/" + names[i], "x");
  ASSERT_OK(WriteFile("/w/" + names.back(), "yy"));
  StatusOr<std::vector<FileInfo>> list = files_->List("/w");
  ASSERT_OK(list);
  std::vector<std::string> got;
  for (const FileInfo& f : *list) {
    got.push_back(f.name);
    EXPECT_EQ(f.path, "/w/" + f.name);
  }
  std::vector<std::string> want = names;
  want.push_back("up");
  EXPECT_THAT(got, UnorderedElementsAreArray(want));
  for (const FileInfo& f : *list) {
    if (f.name == "up") {
      EXPECT_EQ(f.type, FileType::kSymlink);
      EXPECT_EQ(f.symlink_target, "../../..");
    } else if (f.name == "\x80") {
      EXPECT_EQ(f.type, FileType::kRegular);
      EXPECT_EQ(f.size, 2u);
    }
  }
  // Listing through a symlink lists inside the root.
  list = files_->List("/escape/");
  ASSERT_OK(list);
  bool saw_w = false;
  for (const FileInfo& f : *list) saw_w |= f.name == "w" && f.path == "/escape/w";
  EXPECT_TRUE(saw_w);
}

TEST_P(RootedFilesTest, StatUsesLstatSemantics) {
  StatusOr<FileInfo> info = files_->Stat("/escape");
  ASSERT_OK(info);
  EXPECT_EQ(info->type, FileType::kSymlink);
  EXPECT_EQ(info->symlink_target, "/");
  EXPECT_EQ(info->name, "escape");
  info = files_->Stat("/w/up");
  ASSERT_OK(info);
  EXPECT_EQ(info->symlink_target, "../../..");
  info = files_->Stat("/w");
  ASSERT_OK(info);
  EXPECT_EQ(info->type, FileType::kDirectory);
  EXPECT_EQ(info->mode, 0755u);
  info = files_->Stat("/");
  ASSERT_OK(info);
  EXPECT_EQ(info->type, FileType::kDirectory);
  info = files_->Stat("/nope");
  EXPECT_THAT(info, StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(std::string(info.status().message()), HasSubstr("/nope"));
}

TEST_P(RootedFilesTest, RemoveRecursiveNeverFollowsSymlinks) {
  const std::string host_dir = HostTmp("warren-hostdir-" + tag_);
  ASSERT_EQ(mkdir(host_dir.c_str(), 0755), 0);
  HostWrite(host_dir + "/keep", "keep");
  ASSERT_TRUE(fs::create_directories(root_ + "/w/tree/a/b"));
  HostWrite(root_ + "/w/tree/a/b/file", "x");
  HostWrite(root_ + "/w/tree/top", "y");
  ASSERT_EQ(symlink(host_dir.c_str(), (root_ + "/w/tree/abs-link").c_str()), 0);
  ASSERT_EQ(symlink(("../../../../../../../.." + host_dir).c_str(), (root_ + "/w/tree/a/rel-link").c_str()), 0);
  ASSERT_EQ(symlink("/", (root_ + "/w/tree/a/b/root-link").c_str()), 0);

  Status s = files_->Remove("/w/tree", false);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_OK(files_->Remove("/w/tree", true));
  EXPECT_FALSE(HostExists(root_ + "/w/tree"));
  EXPECT_EQ(HostRead(host_dir + "/keep"), "keep");
  EXPECT_TRUE(HostExists(root_ + "/etc/hostname"));
  // The link itself, given as the path, is removed, not its target.
  EXPECT_OK(files_->Remove("/escape", true));
  EXPECT_FALSE(HostExists(root_ + "/escape"));
  EXPECT_TRUE(HostExists(root_ + "/w"));

  EXPECT_THAT(files_->Remove("/", true), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(files_->Remove("/w/..", true), StatusIs(absl::StatusCode::kInvalidArgument));
  s = files_->Remove("/w/none", true);
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(std::string(s.message()), HasSubstr("/w/none"));
}

TEST_P(RootedFilesTest, RenameAndMkdir) {
  ASSERT_OK(WriteFile("/w/a", "A"));
  ASSERT_OK(files_->Rename("/w/a", "/w/b"));
  EXPECT_FALSE(HostExists(root_ + "/w/a"));
  EXPECT_EQ(HostRead(root_ + "/w/b"), "A");
  Status s = files_->Rename("/w/missing", "/w/c");
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(std::string(s.message()), HasSubstr("/w/missing"));

  ASSERT_OK(files_->Mkdir("/w/d", 0750, false));
  struct stat st;
  ASSERT_EQ(stat((root_ + "/w/d").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0750u);
  EXPECT_THAT(files_->Mkdir("/w/d", 0750, false), StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_OK(files_->Mkdir("/w/d", 0750, true));
  EXPECT_THAT(files_->Mkdir("/w/x/y", 0750, false), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_OK(files_->Mkdir("/w/x/y/z", 0700, true));
  ASSERT_EQ(stat((root_ + "/w/x/y/z").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  ASSERT_EQ(stat((root_ + "/w/x").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0755u);
  EXPECT_OK(files_->Mkdir("/", 0755, true));
  // mode 0 is the API default: 0644 for files, 0755 for directories.
  ASSERT_OK(WriteFile(*files_, "/w/m0", "x", false, 0));
  ASSERT_EQ(stat((root_ + "/w/m0").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0644u);
  ASSERT_OK(files_->Mkdir("/w/d0", 0, false));
  ASSERT_EQ(stat((root_ + "/w/d0").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0755u);
  // A file in the way.
  EXPECT_THAT(files_->Mkdir("/w/b/sub", 0755, true), ::testing::Not(IsOk()));
}

TEST_P(RootedFilesTest, WriteErrorsNameThePath) {
  Status s = WriteFile("/w/missing/f", "x");
  EXPECT_THAT(s, StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(std::string(s.message()), HasSubstr("/w/missing/f"));
  s = WriteFile("/w", "x");
  EXPECT_THAT(s, ::testing::Not(IsOk()));
  EXPECT_THAT(std::string(s.message()), HasSubstr("/w"));
  EXPECT_THAT(WriteFile("", "x"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(WriteFile(std::string("/w/a\0b", 6), "x"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(WriteFile("/", "x"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(WriteFile("/w/newdir/", "x"), ::testing::Not(IsOk()));
  EXPECT_FALSE(HostExists(root_ + "/w/newdir"));
  // A FIFO does not hang a read.
  ASSERT_EQ(mkfifo((root_ + "/w/fifo").c_str(), 0644), 0);
  EXPECT_THAT(files_->OpenRead("/w/fifo", 0, 0), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(files_->OpenRead("/w", 0, 0), ::testing::Not(IsOk()));
}

TEST_P(RootedFilesTest, UncommittedWriterLeavesNothing) {
  {
    auto w = files_->OpenWrite("/w/never", 0644, false);
    ASSERT_OK(w);
    ASSERT_OK((*w)->Write("data"));
  }
  EXPECT_FALSE(HostExists(root_ + "/w/never"));
  for (const auto& e : fs::directory_iterator(root_ + "/w")) {
    EXPECT_EQ(e.path().filename().string().find(".warren-tmp-"), std::string::npos) << e.path();
  }
}

TEST_P(RootedFilesTest, NewFilesBelongToTheSandboxRoot) {
  constexpr uid_t kBase = 100000;
  auto files = Make(root_, kBase, kBase + 7);
  // The tree a sandbox's root may write in: its own.
  ASSERT_EQ(chown(root_.c_str(), kBase, kBase + 7), 0);
  ASSERT_EQ(chown((root_ + "/w").c_str(), kBase, kBase + 7), 0);
  ASSERT_OK(WriteFile(*files, "/w/p/q/owned", "x", true, 04751));
  ASSERT_OK(files->Mkdir("/w/m", 0710, false));
  struct stat st;
  for (const char* p : {"/w/p", "/w/p/q", "/w/p/q/owned", "/w/m"}) {
    ASSERT_EQ(lstat((root_ + p).c_str(), &st), 0) << p;
    EXPECT_EQ(st.st_uid, kBase) << p;
    EXPECT_EQ(st.st_gid, kBase + 7) << p;
  }
  ASSERT_EQ(lstat((root_ + "/w/p/q/owned").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 04751u);  // set-id kept: chmod after chown
  StatusOr<FileInfo> info = files->Stat("/w/p/q/owned");
  ASSERT_OK(info);
  EXPECT_EQ(info->uid, 0u);
  EXPECT_EQ(info->gid, 0u);
  // gid base is kBase+7: kBase+7+65536 is just past the mapped range.
  ASSERT_EQ(chown((root_ + "/w/m").c_str(), kBase + 1000, kBase + 7 + 65536), 0);
  info = files->Stat("/w/m");
  ASSERT_OK(info);
  EXPECT_EQ(info->uid, 1000u);
  EXPECT_EQ(info->gid, 65534u);
  // Host root (outside the range) shows as the overflow id.
  info = files->Stat("/etc");
  ASSERT_OK(info);
  EXPECT_EQ(info->uid, 65534u);
  EXPECT_EQ(info->gid, 65534u);
}

// The file API is a deputy of the sandbox's root: /proc and /sys (and any
// other kernel file system) are never reached, by name or through a symlink
// the sandbox planted, whatever the daemon's own rights there.
TEST_P(RootedFilesTest, KernelFileSystemsAreNeverReached) {
  for (const char* d : {"proc", "sys"}) {
    const std::string mnt = root_ + "/" + d;
    ASSERT_EQ(mkdir(mnt.c_str(), 0555), 0);
    if (mount((std::string("/") + d).c_str(), mnt.c_str(), nullptr, MS_BIND, nullptr) != 0) {
      GTEST_SKIP() << "cannot bind-mount /" << d << ": " << strerror(errno);
    }
    mounts_.push_back(mnt);
  }
  // A mask over a /proc dir, as the container backend mounts them: a tmpfs
  // below /proc is as far out of reach (unmounted first: mounts_ order).
  const std::string mask = root_ + "/proc/driver";
  if (mount("tmpfs", mask.c_str(), "tmpfs", MS_RDONLY, "size=4k") == 0) {
    mounts_.insert(mounts_.begin(), mask);
    for (const char* p : {"/proc/driver", "/proc/driver/x"}) {
      Status s = p == std::string("/proc/driver") ? files_->List(p).status() : files_->OpenRead(p, 0, 0).status();
      EXPECT_THAT(s, StatusIs(absl::StatusCode::kPermissionDenied)) << p;
    }
    EXPECT_THAT(files_->Stat("/proc/driver"), StatusIs(absl::StatusCode::kPermissionDenied));
  }
  ASSERT_EQ(symlink("/proc/self", (root_ + "/w/self").c_str()), 0);
  ASSERT_EQ(symlink("/proc", (root_ + "/w/proc").c_str()), 0);
  ASSERT_EQ(symlink("../sys/kernel", (root_ + "/w/kernel").c_str()), 0);
  const absl::StatusCode kDenied = absl::StatusCode::kPermissionDenied;
  for (const char* p : {"/proc/self/status", "/proc/1/maps", "/proc/kmsg", "/proc/self/../self/stat", "/w/self/status",
                        "/w/proc/1/stack", "/w/kernel/uevent_seqnum", "/sys/kernel/uevent_seqnum"}) {
    Status s = files_->OpenRead(p, 0, 0).status();
    EXPECT_THAT(s, StatusIs(kDenied)) << p;
    EXPECT_THAT(std::string(s.message()), HasSubstr(p));
  }
  for (const char* p : {"/proc", "/sys", "/w/proc", "/w/self", "/w/kernel", "/proc/self/fd", "/sys/kernel"}) {
    Status s = files_->List(p).status();
    EXPECT_THAT(s, StatusIs(kDenied)) << p;
    EXPECT_THAT(std::string(s.message()), HasSubstr("/proc, /sys"));
  }
  for (const char* p : {"/proc", "/sys", "/proc/self", "/w/proc/1", "/w/self/exe", "/sys/kernel"}) {
    EXPECT_THAT(files_->Stat(p), StatusIs(kDenied)) << p;
  }
  EXPECT_OK(files_->Stat("/proc/.."));  // "/"
  EXPECT_OK(files_->Stat("/w/proc"));   // the symlink itself, in /w
  EXPECT_THAT(WriteFile("/proc/sys/kernel/warren-test", "x"), StatusIs(kDenied));
  EXPECT_THAT(WriteFile("/w/self/comm", "x"), StatusIs(kDenied));
  EXPECT_THAT(WriteFile("/w/proc/new/file", "x", true), StatusIs(kDenied));
  EXPECT_THAT(files_->Mkdir("/sys/warren-test", 0755, false), StatusIs(kDenied));
  EXPECT_THAT(files_->Mkdir("/w/kernel/a/b", 0755, true), StatusIs(kDenied));
  EXPECT_THAT(files_->Remove("/proc/self/fd", true), StatusIs(kDenied));
  EXPECT_THAT(files_->Rename("/proc/self/comm", "/w/comm"), StatusIs(kDenied));
  EXPECT_THAT(files_->Rename("/w/self", "/sys/self"), StatusIs(kDenied));
  // The rest of the tree is as usable as before.
  StatusOr<std::vector<FileInfo>> root = files_->List("/");
  ASSERT_OK(root);
  EXPECT_OK(ReadFile("/etc/hostname"));
}

// Device nodes, FIFOs and sockets are never opened: not for reading (a
// device's open runs its driver, a FIFO's blocks) and not written over.
TEST_P(RootedFilesTest, SpecialFilesAreNeverOpened) {
  ASSERT_EQ(mknod((root_ + "/w/null").c_str(), S_IFCHR | 0666, makedev(1, 3)), 0);
  ASSERT_EQ(mknod((root_ + "/w/loop").c_str(), S_IFBLK | 0600, makedev(7, 0)), 0);
  ASSERT_EQ(mkfifo((root_ + "/w/fifo").c_str(), 0666), 0);
  ASSERT_EQ(symlink("fifo", (root_ + "/w/fifo-link").c_str()), 0);
  {
    UniqueFd sock(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    ASSERT_TRUE(sock.valid());
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    const std::string path = root_ + "/w/sock";
    ASSERT_LT(path.size(), sizeof addr.sun_path);
    memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    ASSERT_EQ(bind(sock.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  }
  const std::pair<const char*, const char*> cases[] = {{"/w/null", "character device"},
                                                       {"/w/loop", "block device"},
                                                       {"/w/fifo", "FIFO"},
                                                       {"/w/fifo-link", "FIFO"},
                                                       {"/w/sock", "socket"}};
  for (const auto& [p, kind] : cases) {
    const auto t0 = std::chrono::steady_clock::now();
    Status s = files_->OpenRead(p, 0, 0).status();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2)) << p;
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument)) << p;
    EXPECT_THAT(std::string(s.message()), HasSubstr(p));
    EXPECT_THAT(std::string(s.message()), HasSubstr(kind));
  }
  for (const char* p : {"/w/null", "/w/loop", "/w/fifo", "/w/sock"}) {
    Status s = WriteFile(p, "x");
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kInvalidArgument)) << p;
  }
  struct stat st;
  ASSERT_EQ(lstat((root_ + "/w/null").c_str(), &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));                   // not replaced by the write
  StatusOr<FileInfo> info = files_->Stat("/w/null");  // stat is harmless
  ASSERT_OK(info);
  EXPECT_EQ(info->type, FileType::kOther);
}

// The daemon opens as host root, which overrides every mode; the sandbox's
// root overrides modes only on inodes whose owner uid and gid its user
// namespace maps. The file API grants what the sandbox's root has, no more.
TEST_P(RootedFilesTest, NeverMoreThanTheSandboxRoot) {
  constexpr uid_t kBase = 100000;
  auto files = Make(root_, kBase, kBase);
  ASSERT_EQ(chown(root_.c_str(), kBase, kBase), 0);
  ASSERT_EQ(chown((root_ + "/w").c_str(), kBase, kBase), 0);
  auto host_file = [&](const std::string& name, uid_t uid, gid_t gid, mode_t mode) {
    HostWrite(root_ + name, "data of " + name);
    ASSERT_EQ(chown((root_ + name).c_str(), uid, gid), 0);
    ASSERT_EQ(chmod((root_ + name).c_str(), mode), 0);
  };
  host_file("/w/host-secret", 0, 0, 0600);  // unmapped owner: mode bits only
  host_file("/w/host-public", 0, 0, 0644);
  host_file("/w/user-private", kBase + 1000, kBase + 1000, 0600);  // mapped: DAC_OVERRIDE
  host_file("/w/half-mapped", kBase + 1000, 0, 0640);              // gid unmapped: no override, "other" bits
  host_file("/w/own-uid", kBase, 0, 0600);                         // owner bits of its own uid
  ASSERT_EQ(mkdir((root_ + "/w/host-dir").c_str(), 0700), 0);
  ASSERT_EQ(mkdir((root_ + "/w/host-open").c_str(), 0777), 0);
  ASSERT_EQ(chmod((root_ + "/w/host-open").c_str(), 0777), 0);  // past the umask
  auto read = [&](const std::string& p) -> StatusOr<std::string> {
    ASSIGN_OR_RETURN(auto r, files->OpenRead(p, 0, 0));
    return r->Read(1 << 20);
  };
  const absl::StatusCode kDenied = absl::StatusCode::kPermissionDenied;
  Status s = read("/w/host-secret").status();
  EXPECT_THAT(s, StatusIs(kDenied));
  EXPECT_THAT(std::string(s.message()), HasSubstr("/w/host-secret"));
  EXPECT_THAT(read("/w/half-mapped"), StatusIs(kDenied));
  EXPECT_EQ(*read("/w/host-public"), "data of /w/host-public");
  EXPECT_EQ(*read("/w/user-private"), "data of /w/user-private");
  EXPECT_EQ(*read("/w/own-uid"), "data of /w/own-uid");
  EXPECT_THAT(files->List("/w/host-dir"), StatusIs(kDenied));
  EXPECT_THAT(WriteFile(*files, "/w/host-dir/f", "x"), StatusIs(kDenied));
  EXPECT_THAT(files->Mkdir("/w/host-dir/d", 0755, false), StatusIs(kDenied));
  EXPECT_THAT(WriteFile(*files, "/w/host-dir/d/f", "x", true), StatusIs(kDenied));
  EXPECT_THAT(files->Stat("/w/host-dir/f"), StatusIs(kDenied));
  EXPECT_FALSE(HostExists(root_ + "/w/host-dir/f"));
  EXPECT_OK(WriteFile(*files, "/w/host-open/f", "x"));  // "other" may write there
  EXPECT_OK(files->List("/w/host-open"));
  // What lies below a directory root inside may not search stays out of
  // reach, whatever its own owner and mode, by name or through a symlink.
  host_file("/w/host-dir/inner", kBase, kBase, 0644);
  ASSERT_EQ(mkdir((root_ + "/w/host-dir/sub").c_str(), 0777), 0);
  ASSERT_EQ(chown((root_ + "/w/host-dir/sub").c_str(), kBase, kBase), 0);
  ASSERT_EQ(symlink("host-dir/inner", (root_ + "/w/to-inner").c_str()), 0);
  ASSERT_EQ(symlink("/w/host-dir/sub", (root_ + "/w/to-sub").c_str()), 0);
  ASSERT_EQ(symlink("host-public", (root_ + "/w/to-public").c_str()), 0);
  for (const char* p : {"/w/host-dir/inner", "/w/to-inner", "/w/host-dir/sub/../inner"}) {
    EXPECT_THAT(read(p), StatusIs(kDenied)) << p;
  }
  EXPECT_THAT(files->List("/w/host-dir/sub"), StatusIs(kDenied));
  EXPECT_THAT(files->List("/w/to-sub"), StatusIs(kDenied));
  EXPECT_THAT(WriteFile(*files, "/w/to-sub/f", "x"), StatusIs(kDenied));
  EXPECT_THAT(files->Stat("/w/to-sub/f"), StatusIs(kDenied));
  EXPECT_EQ(*read("/w/to-public"), "data of /w/host-public");
}

TEST_P(RootedFilesTest, OpenRootErrorPropagates) {
  RootedFilesOptions opt;
  opt.open_root = []() -> StatusOr<UniqueFd> { return absl::NotFoundError("sandbox sb-1 is gone"); };
  auto files = NewRootedFiles(std::move(opt));
  EXPECT_EQ(files->OpenWrite("/a", 0644, false).status().message(), "sandbox sb-1 is gone");
  EXPECT_EQ(files->OpenRead("/a", 0, 0).status().message(), "sandbox sb-1 is gone");
  EXPECT_EQ(files->Stat("/a").status().message(), "sandbox sb-1 is gone");
  EXPECT_EQ(files->List("/").status().message(), "sandbox sb-1 is gone");
  EXPECT_EQ(files->Mkdir("/a", 0755, true).message(), "sandbox sb-1 is gone");
  EXPECT_EQ(files->Remove("/a", true).message(), "sandbox sb-1 is gone");
  EXPECT_EQ(files->Rename("/a", "/b").message(), "sandbox sb-1 is gone");
  EXPECT_THAT(files->Stat("/a"), StatusIs(absl::StatusCode::kNotFound));
}

TEST_P(RootedFilesTest, FullFileSystemIsResourceExhaustedNamingThePath) {
  const std::string mnt = root_ + "/small";
  ASSERT_EQ(mkdir(mnt.c_str(), 0755), 0);
  if (mount("tmpfs", mnt.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755") != 0) {
    GTEST_SKIP() << "cannot mount tmpfs: " << strerror(errno);
  }
  mounts_.push_back(mnt);
  auto files = Make(mnt, 0, 0);
  {
    auto w = files->OpenWrite("/big", 0644, false);
    ASSERT_OK(w);
    Status s;
    for (int i = 0; i < 4 && s.ok(); ++i) s = (*w)->Write(std::string(1 << 20, 'z'));
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kResourceExhausted));
    EXPECT_THAT(std::string(s.message()), HasSubstr("/big"));
    EXPECT_THAT(std::string(s.message()), HasSubstr("No space left"));
    EXPECT_THAT((*w)->Commit(), ::testing::Not(IsOk()));  // a failed write is never committed
  }
  // The temporary file is gone and the space is back.
  StatusOr<std::vector<FileInfo>> list = files->List("/");
  ASSERT_OK(list);
  EXPECT_TRUE(list->empty());
  EXPECT_OK(WriteFile(*files, "/small-one", std::string(4096, 'a')));
}

// The way the container backend uses it: the root is /proc/<init>/root of a
// process whose root differs from ours (here a chroot'ed child).
TEST_P(RootedFilesTest, RootThroughProcPidRoot) {
  int gate[2];
  ASSERT_EQ(pipe2(gate, O_CLOEXEC), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(gate[1]);
    if (chroot(root_.c_str()) != 0) _exit(1);
    char c;
    (void)!read(gate[0], &c, 1);  // until the parent closes the pipe
    _exit(0);
  }
  close(gate[0]);
  RootedFilesOptions opt;
  const std::string proc_root = "/proc/" + std::to_string(pid) + "/root";
  opt.open_root = [proc_root]() -> StatusOr<UniqueFd> {
    UniqueFd fd(open(proc_root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!fd.valid()) return ErrnoToStatus(errno, "open(" + proc_root + ")");
    return fd;
  };
  auto files = NewRootedFiles(std::move(opt));
  // Wait (bounded) for the chroot to happen: then /proc/<pid>/root/w exists.
  bool ready = false;
  for (int i = 0; i < 500 && !ready; ++i) {
    ready = HostExists(proc_root + "/w/up");
    if (!ready) usleep(10000);
  }
  EXPECT_TRUE(ready);
  const std::string pwned = "pwned-proc-" + tag_;
  HostTmp(pwned);
  EXPECT_OK(WriteFile(*files, "/escape/../../tmp/" + pwned, "p", true));
  EXPECT_EQ(HostRead(root_ + "/tmp/" + pwned), "p");
  EXPECT_FALSE(HostExists("/tmp/" + pwned));
  StatusOr<FileInfo> info = files->Stat("/w/up/escape");
  ASSERT_OK(info);
  EXPECT_EQ(info->symlink_target, "/");
  close(gate[1]);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  // The process is gone: calls fail instead of touching anything.
  EXPECT_THAT(files->Stat("/w"), ::testing::Not(IsOk()));
}

INSTANTIATE_TEST_SUITE_P(Resolvers, RootedFilesTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? std::string("Walk") : std::string("Openat2");
                         });

}  // namespace
}  // namespace warren::runtime

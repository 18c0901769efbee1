#include "node/records/record_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include <google/protobuf/util/json_util.h>
#include <nlohmann/json.hpp>

#include "common/unique_fd.h"
#include "node/records/legacy_record.h"

namespace warren::node {
namespace {

constexpr char kTmpPrefix[] = ".tmp-";

Status WriteAll(int fd, const std::string& data, const std::string& what) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoToStatus(errno, "write(" + what + ")");
    }
    off += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

// Storage-full errors become ResourceExhausted naming the state directory.
Status Annotate(Status s, const std::string& dir) {
  int err = StatusErrno(s);
  if (err == ENOSPC || err == EDQUOT) {
    return absl::ResourceExhaustedError("state dir " + dir + " is full: " + std::string(s.message()));
  }
  return s;
}

}  // namespace

StatusOr<RecordStore> RecordStore::Open(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return ErrnoToStatus(errno, "mkdir(" + dir + ")");
  }
  return RecordStore(dir);
}

Status RecordStore::Put(const std::string& id, const record::Sandbox& record) const {
  std::string data;
  google::protobuf::util::JsonPrintOptions opts;
  opts.preserve_proto_field_names = true;
  if (auto s = google::protobuf::util::MessageToJsonString(record, &data, opts); !s.ok()) {
    return absl::InternalError("record of " + id + " is not serializable: " + std::string(s.message()));
  }
  data += "\n";
  std::string tmp = dir_ + "/" + kTmpPrefix + id + ".json";
  std::string final_path = dir_ + "/" + id + ".json";
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  if (!fd.valid()) return Annotate(ErrnoToStatus(errno, "open(" + tmp + ")"), dir_);
  Status st = WriteAll(fd.get(), data, tmp);
  fd.reset();
  if (st.ok() && ::rename(tmp.c_str(), final_path.c_str()) != 0) {
    st = ErrnoToStatus(errno, "rename(" + tmp + ", " + final_path + ")");
  }
  if (!st.ok()) {
    ::unlink(tmp.c_str());
    return Annotate(st, dir_);
  }
  return absl::OkStatus();
}

Status RecordStore::Remove(const std::string& id) const {
  std::string path = dir_ + "/" + id + ".json";
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return ErrnoToStatus(errno, "unlink(" + path + ")");
  }
  return absl::OkStatus();
}

std::vector<RecordStore::Loaded> RecordStore::LoadAll() const {
  std::vector<Loaded> out;
  DIR* d = ::opendir(dir_.c_str());
  if (d == nullptr) return out;
  std::vector<std::string> names;
  while (struct dirent* e = ::readdir(d)) names.emplace_back(e->d_name);
  ::closedir(d);
  constexpr std::string_view kSuffix = ".json";
  for (const std::string& n : names) {
    if (n.rfind(kTmpPrefix, 0) == 0) {
      ::unlink((dir_ + "/" + n).c_str());
      continue;
    }
    if (n.size() <= kSuffix.size() || n.compare(n.size() - kSuffix.size(), kSuffix.size(), kSuffix) != 0) {
      continue;
    }
    Loaded l{n.substr(0, n.size() - kSuffix.size()), absl::UnknownError("unset")};
    std::string path = dir_ + "/" + n;
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) {
      l.record = ErrnoToStatus(errno, "open(" + path + ")");
      out.push_back(std::move(l));
      continue;
    }
    std::string data;
    char buf[8192];
    Status st;
    for (int i = 0; i < 4096; ++i) {  // records are small; 32 MiB bound
      ssize_t r = ::read(fd.get(), buf, sizeof(buf));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) {
        st = ErrnoToStatus(errno, "read(" + path + ")");
        break;
      }
      if (r == 0) break;
      data.append(buf, static_cast<size_t>(r));
    }
    if (!st.ok()) {
      l.record = st;
    } else {
      nlohmann::json j = nlohmann::json::parse(data, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded() || !j.is_object()) {
        l.record = absl::DataLossError("record " + path + " is not a JSON object");
      } else if (j.value("version", 0) < 2) {
        l.record = FromLegacyRecord(j);
      } else {
        record::Sandbox rec;
        google::protobuf::util::JsonParseOptions opts;
        opts.ignore_unknown_fields = true;  // written by a newer daemon
        if (auto s = google::protobuf::util::JsonStringToMessage(data, &rec, opts); !s.ok()) {
          l.record = absl::DataLossError("record " + path + ": " + std::string(s.message()));
        } else {
          l.record = std::move(rec);
        }
      }
    }
    out.push_back(std::move(l));
  }
  return out;
}

}  // namespace warren::node

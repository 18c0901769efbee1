#include "guest/agent/changes.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <string_view>
#include <utility>
#include <vector>

#include "common/unique_fd.h"
#include "guest/agent/util.h"

namespace warren::guest {
namespace {

constexpr size_t kBlock = 512;
// A path the host's layer builder takes below its staging dir (PATH_MAX).
constexpr size_t kMaxPath = 3800;
constexpr char kOpaque[] = "trusted.overlay.opaque";

std::string Decimal(uint64_t v) { return std::to_string(v); }

// One pax record: "<len> <key>=<value>\n", <len> counting itself.
std::string PaxRecord(const std::string& key, std::string_view value) {
  const size_t body = 1 + key.size() + 1 + value.size() + 1;
  size_t len = body + Decimal(body).size();
  if (Decimal(len).size() + body != len) len = body + Decimal(len).size();
  std::string r = Decimal(len) + " " + key + "=";
  r.append(value);
  r += '\n';
  return r;
}

// `v` as zero-padded octal in a field of `width` bytes (NUL-terminated);
// false when it does not fit (then pax carries the value, the field is 0).
bool Octal(char* field, size_t width, uint64_t v) {
  std::string digits;
  for (uint64_t x = v; x != 0; x >>= 3) digits.insert(digits.begin(), static_cast<char>('0' + (x & 7)));
  if (digits.size() > width - 1) {
    std::memset(field, '0', width - 1);
    field[width - 1] = '\0';
    return false;
  }
  std::memset(field, '0', width - 1 - digits.size());
  std::memcpy(field + width - 1 - digits.size(), digits.data(), digits.size());
  field[width - 1] = '\0';
  return true;
}

struct Header {
  std::string path;  // relative to the upper dir; "." for the root
  char type = '0';   // ustar typeflag
  mode_t mode = 0;
  uint64_t uid = 0, gid = 0, size = 0;
  timespec mtime{};
  std::string link;  // symlink target or hardlink path
  uint32_t dev_major = 0, dev_minor = 0;
  std::vector<std::pair<std::string, std::string>> xattrs;
};

std::string UstarBlock(const std::string& name, char type, uint64_t mode, uint64_t uid, uint64_t gid, uint64_t size,
                       int64_t mtime, const std::string& link, uint32_t dev_major, uint32_t dev_minor) {
  // Fixed-width fields in a zeroed block: the ones shorter than their field
  // end at a NUL of the block; "00" (version) has none by the format.
  std::string b(kBlock, '\0');
  auto put = [&b](size_t at, std::string_view v, size_t max) {
    b.replace(at, std::min(v.size(), max), v.substr(0, max));
  };
  put(0, name, 99);
  char* h = b.data();
  Octal(h + 100, 8, mode & 07777);
  Octal(h + 108, 8, uid);
  Octal(h + 116, 8, gid);
  Octal(h + 124, 12, size);
  Octal(h + 136, 12, mtime > 0 ? static_cast<uint64_t>(mtime) : 0);
  h[156] = type;
  put(157, link, 99);
  put(257, "ustar", 5);
  put(263, "00", 2);
  Octal(h + 329, 8, dev_major);
  Octal(h + 337, 8, dev_minor);
  std::memset(h + 148, ' ', 8);
  unsigned sum = 0;
  for (size_t i = 0; i < kBlock; ++i) sum += static_cast<unsigned char>(h[i]);
  Octal(h + 148, 7, sum);
  h[155] = ' ';
  return b;
}

void Pad(std::string* out) {
  if (out->size() % kBlock != 0) out->append(kBlock - out->size() % kBlock, '\0');
}

// The pax header and the ustar header of `e`.
std::string Encode(const Header& e) {
  std::string pax = PaxRecord("path", e.path);
  if (!e.link.empty()) pax += PaxRecord("linkpath", e.link);
  pax += PaxRecord("uid", Decimal(e.uid)) + PaxRecord("gid", Decimal(e.gid));
  pax += PaxRecord("size", Decimal(e.size));
  std::string mtime = std::to_string(e.mtime.tv_sec);
  if (e.mtime.tv_sec >= 0) {
    std::string ns = std::to_string(e.mtime.tv_nsec);
    mtime += "." + std::string(9 - ns.size(), '0') + ns;
  }
  pax += PaxRecord("mtime", mtime);
  for (const auto& [name, value] : e.xattrs) pax += PaxRecord("SCHILY.xattr." + name, value);
  std::string out = UstarBlock("PaxHeaders/entry", 'x', 0644, 0, 0, pax.size(), 0, "", 0, 0);
  out += pax;
  Pad(&out);
  out += UstarBlock(e.path, e.type, e.mode, e.uid, e.gid, e.size, e.mtime.tv_sec, e.link, e.dev_major, e.dev_minor);
  return out;
}

// The xattrs of `name` in `dir_fd` (not followed) that a layer keeps,
// without the opaque marker (reported in *opaque).
Status ReadXattrs(int dir_fd, const std::string& name, const std::string& shown,
                  std::vector<std::pair<std::string, std::string>>* out, bool* opaque) {
  *opaque = false;
  const std::string proc = "/proc/self/fd/" + std::to_string(dir_fd) + "/" + name;
  std::string names(4096, '\0');
  ssize_t n = ::llistxattr(proc.c_str(), names.data(), names.size());
  if (n < 0 && errno == ERANGE) {
    names.resize(65536);
    n = ::llistxattr(proc.c_str(), names.data(), names.size());
  }
  if (n < 0) {
    if (errno == ENOTSUP) return absl::OkStatus();
    return ErrnoToStatus(errno, "llistxattr(" + shown + ")");
  }
  names.resize(static_cast<size_t>(n));
  std::string value(65536, '\0');
  for (size_t at = 0; at < names.size();) {
    std::string x(names.c_str() + at);
    at += x.size() + 1;
    if (x.empty() || x.rfind("security.", 0) == 0) continue;
    const bool overlay = x.rfind("trusted.overlay.", 0) == 0;
    if (overlay && x != kOpaque) continue;
    ssize_t v = ::lgetxattr(proc.c_str(), x.c_str(), value.data(), value.size());
    if (v < 0) {
      if (errno == ENODATA) continue;
      return ErrnoToStatus(errno, "lgetxattr(" + shown + ", " + x + ")");
    }
    if (overlay) {
      *opaque = v == 1 && value[0] == 'y';
      continue;
    }
    out->emplace_back(x, value.substr(0, static_cast<size_t>(v)));
  }
  return absl::OkStatus();
}

class ChangesReader : public runtime::FileReader {
 public:
  ChangesReader(int upper_fd, std::string freeze_cgroup) : upper_fd_(upper_fd), freeze_(std::move(freeze_cgroup)) {
    if (freeze_.empty()) return;
    if (!WriteFile(freeze_ + "/cgroup.freeze", "1")) {
      freeze_.clear();  // no freezer: the walk sees the tree as it changes
      return;
    }
    // Freezing is asynchronous: wait (bounded) until every task stopped.
    for (int i = 0; i < 200 && ReadFile(freeze_ + "/cgroup.events", 4096).find("frozen 1") == std::string::npos; ++i) {
      ::usleep(10000);
    }
  }
  ~ChangesReader() override {
    for (Dir& d : stack_) ::closedir(d.dir);
    if (!freeze_.empty()) (void)WriteFile(freeze_ + "/cgroup.freeze", "0");
  }
  ChangesReader(const ChangesReader&) = delete;
  ChangesReader& operator=(const ChangesReader&) = delete;

  StatusOr<std::string> Read(size_t max) override {
    std::string out;
    while (out.size() < max) {
      if (pos_ < buf_.size()) {
        size_t n = std::min(max - out.size(), buf_.size() - pos_);
        out.append(buf_, pos_, n);
        pos_ += n;
        continue;
      }
      buf_.clear();
      pos_ = 0;
      if (file_.valid()) {
        RETURN_IF_ERROR(FileData());
        continue;
      }
      if (done_) break;
      RETURN_IF_ERROR(Step());
    }
    return out;
  }

 private:
  struct Dir {
    DIR* dir;
    std::string path;  // "" for the root
  };

  // The next chunk of the current regular file into buf_ (zeros if it
  // shrank meanwhile; the tar header promised `remaining_` bytes), then its
  // padding.
  Status FileData() {
    if (remaining_ == 0) {
      file_.reset();
      buf_.assign((kBlock - written_ % kBlock) % kBlock, '\0');
      return absl::OkStatus();
    }
    buf_.resize(std::min<uint64_t>(remaining_, 64u << 10));
    ssize_t n = ::read(file_.get(), buf_.data(), buf_.size());
    if (n < 0 && errno == EINTR) {
      buf_.clear();
      return absl::OkStatus();
    }
    if (n < 0) return ErrnoToStatus(errno, "read(" + file_path_ + ")");
    if (n == 0) {
      std::fill(buf_.begin(), buf_.end(), '\0');
    } else {
      buf_.resize(static_cast<size_t>(n));
    }
    remaining_ -= buf_.size();
    written_ += buf_.size();
    return absl::OkStatus();
  }

  // The next entry's headers into buf_ (and its file opened), or the end.
  Status Step() {
    if (!started_) {
      started_ = true;
      struct stat st;
      if (::fstat(upper_fd_, &st) != 0) return ErrnoToStatus(errno, "fstat(upper)");
      Header h = Base(".", st, '5');
      bool opaque;
      RETURN_IF_ERROR(ReadXattrs(upper_fd_, ".", "/", &h.xattrs, &opaque));
      buf_ = Encode(h);
      int fd = ::openat(upper_fd_, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      if (fd < 0) return ErrnoToStatus(errno, "openat(upper)");
      return Push(fd, "");
    }
    if (stack_.empty()) {
      buf_.assign(2 * kBlock, '\0');  // end of archive
      done_ = true;
      return absl::OkStatus();
    }
    Dir& top = stack_.back();
    errno = 0;
    dirent* de = ::readdir(top.dir);
    if (de == nullptr) {
      if (errno != 0) return ErrnoToStatus(errno, "readdir(/" + top.path + ")");
      ::closedir(top.dir);
      stack_.pop_back();
      return absl::OkStatus();
    }
    const std::string name = de->d_name;
    if (name == "." || name == "..") return absl::OkStatus();
    const std::string rel = top.path.empty() ? name : top.path + "/" + name;
    const std::string shown = "/" + rel;
    if (rel.size() > kMaxPath) {
      return absl::FailedPreconditionError("path " + shown.substr(0, 200) + "... is longer than " +
                                           std::to_string(kMaxPath) + " bytes (more than a layer holds)");
    }
    const int dfd = ::dirfd(top.dir);
    struct stat st;
    if (::fstatat(dfd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      return ErrnoToStatus(errno, "fstatat(" + shown + ")");
    }
    bool opaque = false;
    if (S_ISCHR(st.st_mode) && st.st_rdev == makedev(0, 0)) {  // overlay whiteout
      Header h = Base(top.path.empty() ? ".wh." + name : top.path + "/.wh." + name, st, '0');
      h.mode = 0;
      buf_ = Encode(h);
      return absl::OkStatus();
    }
    if (S_ISSOCK(st.st_mode)) return absl::OkStatus();
    Header h = Base(rel, st, '0');
    RETURN_IF_ERROR(ReadXattrs(dfd, name, shown, &h.xattrs, &opaque));
    if (S_ISDIR(st.st_mode)) {
      h.type = '5';
      int fd = ::openat(dfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (fd < 0) return ErrnoToStatus(errno, "openat(" + shown + ")");
      buf_ = Encode(h);
      if (opaque) buf_ += Encode(Base(rel + "/.wh..wh..opq", st, '0'));
      return Push(fd, rel);
    }
    if (S_ISLNK(st.st_mode)) {
      h.type = '2';
      std::string target(4096, '\0');
      ssize_t n = ::readlinkat(dfd, name.c_str(), target.data(), target.size());
      if (n < 0) return ErrnoToStatus(errno, "readlinkat(" + shown + ")");
      h.link.assign(target.data(), static_cast<size_t>(n));
      buf_ = Encode(h);
      return absl::OkStatus();
    }
    if (S_ISFIFO(st.st_mode) || S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) {
      h.type = S_ISFIFO(st.st_mode) ? '6' : S_ISCHR(st.st_mode) ? '3' : '4';
      h.dev_major = major(st.st_rdev);
      h.dev_minor = minor(st.st_rdev);
      buf_ = Encode(h);
      return absl::OkStatus();
    }
    if (!S_ISREG(st.st_mode)) return absl::OkStatus();
    if (st.st_nlink > 1) {
      auto [it, first] = links_.try_emplace({st.st_dev, st.st_ino}, rel);
      if (!first) {
        h.type = '1';
        h.link = it->second;
        buf_ = Encode(h);
        return absl::OkStatus();
      }
    }
    UniqueFd fd(::openat(dfd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC));
    if (!fd.valid()) return ErrnoToStatus(errno, "openat(" + shown + ")");
    h.size = static_cast<uint64_t>(st.st_size);
    buf_ = Encode(h);
    file_ = std::move(fd);
    file_path_ = shown;
    remaining_ = h.size;
    written_ = 0;
    return absl::OkStatus();
  }

  static Header Base(const std::string& path, const struct stat& st, char type) {
    Header h;
    h.path = path;
    h.type = type;
    h.mode = st.st_mode & 07777;
    h.uid = st.st_uid;
    h.gid = st.st_gid;
    h.mtime = st.st_mtim;
    return h;
  }

  Status Push(int fd, const std::string& path) {
    DIR* d = ::fdopendir(fd);
    if (d == nullptr) {
      int e = errno;
      ::close(fd);
      return ErrnoToStatus(e, "fdopendir(/" + path + ")");
    }
    stack_.push_back(Dir{d, path});
    return absl::OkStatus();
  }

  const int upper_fd_;
  std::string freeze_;
  std::vector<Dir> stack_;
  std::map<std::pair<dev_t, ino_t>, std::string> links_;  // first path of each multi-link file
  std::string buf_;
  size_t pos_ = 0;
  UniqueFd file_;  // the regular file whose data comes next
  std::string file_path_;
  uint64_t remaining_ = 0, written_ = 0;
  bool started_ = false, done_ = false;
};

}  // namespace

StatusOr<std::unique_ptr<runtime::FileReader>> OpenChangesTar(int upper_fd, const std::string& freeze_cgroup) {
  if (upper_fd < 0) return absl::FailedPreconditionError("the guest has no writable layer mounted");
  return std::unique_ptr<runtime::FileReader>(new ChangesReader(upper_fd, freeze_cgroup));
}

}  // namespace warren::guest

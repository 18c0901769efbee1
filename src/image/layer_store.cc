#include "image/layer_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>

#include "common/file_util.h"
#include "common/unique_fd.h"
#include "image/erofs.h"
#include "image/fs_util.h"
#include "image/tar_extract.h"
#include "image/tree_compare.h"

namespace warren::image {
namespace {

constexpr const char* kKinds[] = {"base", "workspace", "toolset"};
constexpr char kDigestPrefix[] = "sha256:";

// Removes a file or tree on scope exit unless released (rollback guard).
class RemoveGuard {
 public:
  explicit RemoveGuard(std::string path) : path_(std::move(path)) {}
  ~RemoveGuard() {
    if (!path_.empty()) (void)RemoveTree(path_);
  }
  void Release() { path_.clear(); }

 private:
  std::string path_;
};

bool IsHex64(std::string_view s) {
  if (s.size() != 64) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// "sha256:<hex>" -> "<hex>"; InvalidArgument otherwise.
StatusOr<std::string> DigestHex(std::string_view digest) {
  std::string_view prefix(kDigestPrefix);
  if (digest.substr(0, prefix.size()) != prefix || !IsHex64(digest.substr(prefix.size()))) {
    return absl::InvalidArgumentError("digest \"" + std::string(digest) + "\" is not sha256:<64 lower-case hex>");
  }
  return std::string(digest.substr(prefix.size()));
}

// The lines of a meta/<hex>.projects file, each once, in file order.
std::vector<std::string> ParseOwners(std::string_view text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    if (nl == std::string_view::npos) nl = text.size();
    std::string line(text.substr(start, nl - start));
    if (!line.empty() && std::find(out.begin(), out.end(), line) == out.end()) out.push_back(std::move(line));
    start = nl + 1;
  }
  return out;
}

// Natural order: digit runs compare as numbers ("9" < "10"), the rest bytewise.
bool VersionLess(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (isdigit(static_cast<unsigned char>(a[i])) && isdigit(static_cast<unsigned char>(b[j]))) {
      size_t i2 = i, j2 = j;
      while (i2 < a.size() && isdigit(static_cast<unsigned char>(a[i2]))) ++i2;
      while (j2 < b.size() && isdigit(static_cast<unsigned char>(b[j2]))) ++j2;
      std::string da = a.substr(i, i2 - i), db = b.substr(j, j2 - j);
      da.erase(0, std::min(da.find_first_not_of('0'), da.size()));
      db.erase(0, std::min(db.find_first_not_of('0'), db.size()));
      if (da.size() != db.size()) return da.size() < db.size();
      if (da != db) return da < db;
      i = i2;
      j = j2;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i;
      ++j;
    }
  }
  if ((a.size() - i) != (b.size() - j)) return (a.size() - i) < (b.size() - j);
  return a < b;
}

std::vector<std::string> ListNames(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;  // ".", "..", and never a valid name
    out.emplace_back(e->d_name);
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

int64_t MtimeNs(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

}  // namespace

StatusOr<std::unique_ptr<LayerStore>> LayerStore::Open(const std::string& dir) {
  if (dir.empty() || dir[0] != '/') {
    return absl::InvalidArgumentError("layer store dir \"" + dir + "\" must be absolute");
  }
  std::unique_ptr<LayerStore> s(new LayerStore(dir));
  for (const char* sub : {"blobs/sha256", "meta", "tmp", "names/base", "names/workspace", "names/toolset"}) {
    RETURN_IF_ERROR(MakeDirs(dir + "/" + sub));
  }
  // Staging trees from tars may hold setuid files and devices until they are
  // built, and blobs hold sandboxes' snapshots: nobody but root may reach them.
  const std::string tmp = dir + "/tmp";
  if (chmod(tmp.c_str(), 0700) != 0) return ErrnoToStatus(errno, "chmod(" + tmp + ")");
  const std::string blobs = dir + "/blobs";
  if (chmod(blobs.c_str(), 0700) != 0) return ErrnoToStatus(errno, "chmod(" + blobs + ")");
  for (const std::string& name : ListNames(tmp)) {
    if (MadeByDeadLocalProcess(name)) (void)RemoveTree(tmp + "/" + name);
  }
  return s;
}

std::string LayerStore::BlobPath(std::string_view digest) const {
  std::string_view prefix(kDigestPrefix);
  if (digest.substr(0, prefix.size()) == prefix) digest.remove_prefix(prefix.size());
  return dir_ + "/blobs/sha256/" + std::string(digest);
}

std::string LayerStore::NamePath(const LayerName& name) const {
  return dir_ + "/names/" + LayerName{name.kind, name.name, ""}.ToString() + "/" + name.version;
}

std::string LayerStore::TmpPath(std::string_view what) const {
  return dir_ + "/tmp/" + std::string(what) + "-" + UniqueSuffix();
}

StatusOr<LayerInfo> LayerStore::BuildFromDir(std::string_view name, const std::string& dir) {
  ASSIGN_OR_RETURN(LayerName n, LayerName::Parse(name));
  if (n.version.empty()) {
    return absl::InvalidArgumentError("layer name \"" + std::string(name) +
                                      "\": building needs a version (kind/name@version)");
  }
  return BuildImage(n, dir);
}

StatusOr<LayerInfo> LayerStore::BuildFromSandboxDir(std::string_view name, const std::string& dir,
                                                    const std::string& project) {
  ASSIGN_OR_RETURN(LayerName n, LayerName::Parse(name));
  if (n.version.empty()) {
    return absl::InvalidArgumentError("layer name \"" + std::string(name) +
                                      "\": building needs a version (kind/name@version)");
  }
  return BuildImage(n, dir, /*from_sandbox=*/true, /*chunked=*/false, project);
}

StatusOr<LayerInfo> LayerStore::BuildFromTar(std::string_view name, const std::string& tar_path,
                                             const TarProgressFn& progress) {
  ASSIGN_OR_RETURN(LayerName n, LayerName::Parse(name));
  if (n.version.empty()) {
    return absl::InvalidArgumentError("layer name \"" + std::string(name) +
                                      "\": building needs a version (kind/name@version)");
  }
  std::string stage = TmpPath("stage");
  if (mkdir(stage.c_str(), 0755) != 0) return ErrnoToStatus(errno, "mkdir(" + stage + ")");
  RemoveGuard remove_stage(stage);  // always: the staging tree is never kept
  // mkdir applied the umask; the root of a layer without a "./" entry is 0755.
  if (chmod(stage.c_str(), 0755) != 0) return ErrnoToStatus(errno, "chmod(" + stage + ")");
  bool sparse = false;
  RETURN_IF_ERROR(ExtractTar(tar_path, stage, progress, &sparse));
  return BuildImage(n, stage, /*from_sandbox=*/false, /*chunked=*/sparse);
}

StatusOr<LayerInfo> LayerStore::BuildImage(const LayerName& name, const std::string& src, bool from_sandbox,
                                           bool chunked, const std::string& project) {
  UniqueFd src_fd(open(src.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!src_fd.valid()) return ErrnoToStatus(errno, "open(" + src + ")");
  std::string image = TmpPath("build") + ".erofs";
  RemoveGuard remove_image(image);
  // Chunk-based: holes stay holes, identical 4 KiB blocks are stored once,
  // and the metadata comes first (what a node's read cache keeps local).
  RETURN_IF_ERROR(MkfsErofs(image, src, /*chunked=*/from_sandbox || chunked || chunked_layers_, from_sandbox));
  if (chmod(image.c_str(), 0444) != 0) return ErrnoToStatus(errno, "chmod(" + image + ")");
  struct stat st;
  if (stat(image.c_str(), &st) != 0) return ErrnoToStatus(errno, "stat(" + image + ")");
  ASSIGN_OR_RETURN(std::string hex, Sha256File(image));
  {
    // Verify through a detached mount: nothing is attached anywhere, and
    // closing the fds unmounts it even if we fail half-way.
    ASSIGN_OR_RETURN(UniqueFd mnt, MountErofs(image));
    UniqueFd root(openat(mnt.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!root.valid()) return ErrnoToStatus(errno, "openat(mount of " + image + ")");
    RETURN_IF_ERROR(CompareTrees(src_fd.get(), root.get()));
  }
  ASSIGN_OR_RETURN(LayerInfo info, Publish(name, image, hex, static_cast<uint64_t>(st.st_size), from_sandbox, project));
  remove_image.Release();  // renamed into blobs/ or already unlinked
  return info;
}

StatusOr<LayerInfo> LayerStore::Publish(const LayerName& name, const std::string& tmp_image, const std::string& hex,
                                        uint64_t size, bool from_sandbox, const std::string& project) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string digest = kDigestPrefix + hex;
  const std::string name_path = NamePath(name);
  auto existing = [&]() -> StatusOr<LayerInfo> {
    ASSIGN_OR_RETURN(LayerInfo cur, Resolve(name.ToString()));
    if (cur.digest != digest) {
      return absl::AlreadyExistsError("layer " + name.ToString() + " already points at " + cur.digest + ", not " +
                                      digest);
    }
    unlink(tmp_image.c_str());
    return cur;
  };
  const std::string marker = dir_ + "/meta/" + hex + ".sandbox";
  if (from_sandbox && access(marker.c_str(), F_OK) != 0) {
    // Before any name points at it: a create that resolves the digest
    // afterwards sees the mark.
    RETURN_IF_ERROR(WriteFileAtomic(marker, "1\n"));
  }
  const std::string blob = BlobPath(hex);
  if (!project.empty()) {
    // The owner before any name points at it (as the mark above). Bytes
    // that were already every project's (a blob without owners) stay so.
    const std::string owners = dir_ + "/meta/" + hex + ".projects";
    StatusOr<std::string> cur = ReadSmallFile(owners);
    if (cur.ok() || access(blob.c_str(), F_OK) != 0) {
      std::vector<std::string> have = cur.ok() ? ParseOwners(*cur) : std::vector<std::string>{};
      if (std::find(have.begin(), have.end(), project) == have.end()) {
        // One O_APPEND write of a line: whole even beside another node's.
        UniqueFd fd(open(owners.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
        if (!fd.valid()) return ErrnoToStatus(errno, "open(" + owners + ")");
        RETURN_IF_ERROR(WriteAll(fd.get(), project + "\n", owners));
      }
    }
  }
  if (access(name_path.c_str(), F_OK) == 0) return existing();

  const std::string meta = dir_ + "/meta/" + hex + ".json";
  bool new_blob = false;
  if (access(blob.c_str(), F_OK) == 0) {
    unlink(tmp_image.c_str());  // same digest, same bytes
  } else {
    if (rename(tmp_image.c_str(), blob.c_str()) != 0) {
      return ErrnoToStatus(errno, "rename(" + tmp_image + ", " + blob + ")");
    }
    new_blob = true;
  }
  auto rollback = [&]() {
    if (new_blob) {
      unlink(blob.c_str());
      unlink(meta.c_str());
    }
  };
  if (access(meta.c_str(), F_OK) != 0) {
    nlohmann::json j = {{"name", name.ToString()}, {"size", size}, {"created_at_ns", NowRealtimeNs()}};
    if (Status s = WriteFileAtomic(meta, j.dump() + "\n"); !s.ok()) {
      rollback();
      return s;
    }
  }
  Status s = MakeDirs(name_path.substr(0, name_path.rfind('/')));
  if (s.ok()) s = CreateFileExclusive(name_path, digest + "\n");
  if (!s.ok()) {
    if (StatusErrno(s) == EEXIST) {
      // Another node named it meanwhile; if it named these bytes, the blob
      // is (also) theirs and stays.
      StatusOr<LayerInfo> r = existing();
      if (!r.ok()) rollback();
      return r;
    }
    rollback();
    return s;
  }
  return Resolve(name.ToString());
}

StatusOr<LayerInfo> LayerStore::Resolve(std::string_view ref) const {
  if (ref.substr(0, strlen(kDigestPrefix)) == kDigestPrefix) {
    ASSIGN_OR_RETURN(std::string hex, DigestHex(ref));
    struct stat st;
    const std::string blob = BlobPath(hex);
    if (stat(blob.c_str(), &st) != 0) {
      if (errno == ENOENT) return absl::NotFoundError("layer " + std::string(ref) + " not found");
      return ErrnoToStatus(errno, "stat(" + blob + ")");
    }
    LayerInfo info;
    info.digest = std::string(ref);
    info.size_bytes = static_cast<uint64_t>(st.st_size);
    info.created_at_ns = MtimeNs(st);
    info.from_sandbox = access((dir_ + "/meta/" + hex + ".sandbox").c_str(), F_OK) == 0;
    if (StatusOr<std::string> owners = ReadSmallFile(dir_ + "/meta/" + hex + ".projects"); owners.ok()) {
      info.projects = ParseOwners(*owners);
    }
    auto meta = ReadSmallFile(dir_ + "/meta/" + hex + ".json");
    if (meta.ok()) {
      auto j = nlohmann::json::parse(*meta, nullptr, /*allow_exceptions=*/false);
      if (j.is_object() && j.contains("created_at_ns") && j["created_at_ns"].is_number()) {
        info.created_at_ns = j["created_at_ns"].get<int64_t>();
      }
    }
    return info;
  }
  ASSIGN_OR_RETURN(LayerName n, LayerName::Parse(ref));
  if (n.version.empty()) {
    // Newest: latest-created name, ties by natural version order.
    const std::string dir = dir_ + "/names/" + n.ToString();
    std::optional<std::pair<int64_t, std::string>> best;
    for (const std::string& v : ListNames(dir)) {
      struct stat st;
      if (v.find(".tmp-") != std::string::npos) continue;  // a name being written
      if (stat((dir + "/" + v).c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
      std::pair<int64_t, std::string> cand{MtimeNs(st), v};
      if (!best || best->first < cand.first || (best->first == cand.first && VersionLess(best->second, cand.second))) {
        best = cand;
      }
    }
    if (!best) return absl::NotFoundError("layer " + n.ToString() + " not found");
    n.version = best->second;
  }
  const std::string path = NamePath(n);
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::NotFoundError("layer " + n.ToString() + " not found");
    return ErrnoToStatus(errno, "stat(" + path + ")");
  }
  ASSIGN_OR_RETURN(std::string text, ReadSmallFile(path, 4096));
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  if (!DigestHex(text).ok()) {
    return absl::DataLossError("name file " + path + " does not hold a digest");
  }
  ASSIGN_OR_RETURN(LayerInfo info, Resolve(text));
  info.name = n.ToString();
  info.created_at_ns = MtimeNs(st);
  return info;
}

std::vector<LayerInfo> LayerStore::List() const {
  std::vector<LayerInfo> out;
  for (const char* kind : kKinds) {
    const std::string kdir = dir_ + "/names/" + kind;
    for (const std::string& name : ListNames(kdir)) {
      for (const std::string& v : ListNames(kdir + "/" + name)) {
        if (v.find(".tmp-") != std::string::npos) continue;
        auto info = Resolve(std::string(kind) + "/" + name + "@" + v);
        if (info.ok()) out.push_back(*std::move(info));
      }
    }
  }
  std::sort(out.begin(), out.end(), [](const LayerInfo& a, const LayerInfo& b) { return a.name < b.name; });
  return out;
}

Status LayerStore::Remove(std::string_view ref) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string digest;
  std::vector<LayerName> names;
  if (ref.substr(0, strlen(kDigestPrefix)) == kDigestPrefix) {
    ASSIGN_OR_RETURN(LayerInfo info, Resolve(ref));
    digest = info.digest;
    for (const LayerInfo& l : List()) {
      if (l.digest == digest) names.push_back(*LayerName::Parse(l.name));
    }
  } else {
    ASSIGN_OR_RETURN(LayerName n, LayerName::Parse(ref));
    if (n.version.empty()) {
      return absl::InvalidArgumentError("removing layer " + n.ToString() + " needs an explicit @version or a digest");
    }
    ASSIGN_OR_RETURN(LayerInfo info, Resolve(ref));
    digest = info.digest;
    names.push_back(n);
  }
  // The blob goes when no other name points at it: take its write lock
  // first (HoldBlob's readers: a sandbox of any node sharing the store using
  // it, or a create about to mount it), held until it is unlinked.
  bool blob_goes = true;
  for (const LayerInfo& l : List()) {
    if (l.digest == digest &&
        std::none_of(names.begin(), names.end(), [&](const LayerName& n) { return n.ToString() == l.name; })) {
      blob_goes = false;
    }
  }
  UniqueFd write_lock;
  if (blob_goes) {
    const std::string blob = BlobPath(digest);
    write_lock = UniqueFd(open(blob.c_str(), O_RDWR | O_CLOEXEC));
    if (!write_lock.valid() && errno != ENOENT) return ErrnoToStatus(errno, "open(" + blob + ")");
    struct flock fl {};
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = kBlobHoldLockByte;
    fl.l_len = 1;
    if (write_lock.valid() && fcntl(write_lock.get(), F_OFD_SETLK, &fl) != 0) {
      if (errno == EAGAIN || errno == EACCES) {
        return absl::FailedPreconditionError(
            "layer " + std::string(ref) + " (" + digest +
            ") is held: a node sharing this layer store has it in use (a sandbox, a create about to mount it, or "
            "the fncall pool: a read lock on its blob " +
            blob + "); nothing removed");
      }
      if (errno != EINVAL && errno != ENOLCK && errno != EOPNOTSUPP) {
        return ErrnoToStatus(errno, "fcntl(" + blob + ", F_OFD_SETLK, F_WRLCK)");
      }
    }
  }
  for (const LayerName& n : names) {
    const std::string path = NamePath(n);
    if (unlink(path.c_str()) != 0 && errno != ENOENT) {
      return ErrnoToStatus(errno, "unlink(" + path + ")");
    }
    rmdir(path.substr(0, path.rfind('/')).c_str());  // fails (ENOTEMPTY) if other versions
  }
  for (const LayerInfo& l : List()) {
    if (l.digest == digest) return absl::OkStatus();  // still named elsewhere
  }
  const std::string hex = digest.substr(strlen(kDigestPrefix));
  const std::string blob = BlobPath(hex);
  if (unlink(blob.c_str()) != 0 && errno != ENOENT) {
    return ErrnoToStatus(errno, "unlink(" + blob + ")");
  }
  unlink((dir_ + "/meta/" + hex + ".json").c_str());
  unlink((dir_ + "/meta/" + hex + ".sandbox").c_str());
  unlink((dir_ + "/meta/" + hex + ".projects").c_str());
  unlink((dir_ + "/meta/" + hex + ".hot").c_str());  // ReadCache's hot list
  return absl::OkStatus();
}

StatusOr<UniqueFd> LayerStore::HoldBlob(std::string_view digest) const {
  const std::string blob = BlobPath(digest);
  const std::string name = "layer " + std::string(kDigestPrefix) + blob.substr(blob.rfind('/') + 1);
  UniqueFd fd(open(blob.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    if (errno == ENOENT) return absl::NotFoundError(name + " not in the store");
    return ErrnoToStatus(errno, "open(" + blob + ")");
  }
  struct flock fl {};
  fl.l_type = F_RDLCK;
  fl.l_whence = SEEK_SET;
  fl.l_start = kBlobHoldLockByte;
  fl.l_len = 1;
  if (fcntl(fd.get(), F_OFD_SETLK, &fl) != 0) {
    if (errno == EAGAIN || errno == EACCES) {
      return absl::UnavailableError(name + " is being removed (a remove holds its blob's write lock)");
    }
    if (errno != EINVAL && errno != ENOLCK && errno != EOPNOTSUPP) {
      return ErrnoToStatus(errno, "fcntl(" + blob + ", F_OFD_SETLK, F_RDLCK)");
    }
  }
  // Opened just before a remove unlinked it: the lock came too late.
  struct stat st {};
  if (fstat(fd.get(), &st) != 0) return ErrnoToStatus(errno, "fstat(" + blob + ")");
  if (st.st_nlink == 0) return absl::NotFoundError(name + " was removed from the store");
  return fd;
}

}  // namespace warren::image

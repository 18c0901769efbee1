// warren cp SRC DST: copy one file (or, with -r, a tree) between the host and
// a sandbox. One side is "ID:/path".
//
// Like cp(1): when the destination is an existing directory (or ends in '/'),
// the source's basename is appended. Uploads stream in 1 MiB chunks and keep
// the permission bits; downloads stream into a temporary file next to the
// target that is renamed into place only when complete (a failed download
// leaves nothing), with the permission bits masked to 0777 (no set-id bits
// from a sandbox onto the host). "-" is stdin (upload) / stdout (download).
// -r copies regular files and directories; other file types are skipped with
// a note on stderr. Output: nothing (human) or {"src", "dst", "files",
// "bytes"} (--json; not when downloading to stdout).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cli/client.h"
#include "cli/commands.h"
#include "cli/output.h"
#include "common/unique_fd.h"

namespace warren::cli {
namespace {

// Deep enough for any real tree, bounded so a hostile one cannot recurse us
// forever.
constexpr int kMaxDepth = 128;

std::string Basename(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  size_t slash = p.rfind('/');
  std::string base = slash == std::string::npos ? p : p.substr(slash + 1);
  return base == "/" ? "" : base;
}

std::string Join(const std::string& dir, const std::string& name) {
  if (name.empty()) return dir;
  if (dir.empty() || dir.back() == '/') return dir + name;
  return dir + "/" + name;
}

// Safe as a single host path component.
bool IsPlainName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

void Note(const std::string& msg) {
  std::cout.flush();
  std::cerr << "warren: " << msg << std::endl;
}

class Copier {
 public:
  Copier(const GlobalOptions& g, const CpArgs& a) : client_(g), args_(a) {}

  uint64_t bytes() const { return bytes_; }
  uint64_t files() const { return files_; }

  // Remote stat; NOT_FOUND is returned as is.
  StatusOr<v1::FileInfo> Stat(const std::string& id, const std::string& path) {
    grpc::ClientContext ctx;
    client_.Prepare(&ctx);
    v1::StatRequest req;
    req.set_sandbox_id(id);
    req.set_path(path);
    v1::FileInfo info;
    Status st = FromGrpc(client_.files().Stat(&ctx, req, &info));
    if (!st.ok()) return Status(st.code(), absl::StrCat(id, ":", path, ": ", st.message()));
    return info;
  }

  // The remote path a host `src` lands on, cp(1)-style.
  StatusOr<std::string> UploadTarget(const std::string& id, const std::string& dst, const std::string& src_name) {
    if (absl::EndsWith(dst, "/")) {
      if (src_name.empty()) {
        return absl::InvalidArgumentError("stdin needs a file name as destination");
      }
      return Join(dst, src_name);
    }
    StatusOr<v1::FileInfo> info = Stat(id, dst);
    if (info.ok() && info->type() == v1::FILE_TYPE_DIRECTORY) {
      if (src_name.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(id, ":", dst, " is a directory; stdin needs a file name"));
      }
      return Join(dst, src_name);
    }
    if (!info.ok() && info.status().code() != absl::StatusCode::kNotFound) {
      return info.status();
    }
    return dst;
  }

  Status UploadFile(int fd, const std::string& what, uint32_t mode, const std::string& id, const std::string& path) {
    grpc::ClientContext ctx;
    client_.Prepare(&ctx);
    v1::WriteFileResponse resp;
    std::unique_ptr<grpc::ClientWriter<v1::WriteFileRequest>> writer = client_.files().Write(&ctx, &resp);
    v1::WriteFileRequest msg;
    msg.set_sandbox_id(id);
    msg.set_path(path);
    msg.set_mode(mode);
    msg.set_make_parents(args_.parents);
    std::string buf(kChunkBytes, '\0');
    Status local = absl::OkStatus();
    for (bool first = true;; first = false) {
      StatusOr<size_t> n = ReadFull(fd, buf.data(), buf.size(), what);
      if (!n.ok()) {
        local = n.status();
        ctx.TryCancel();
        break;
      }
      if (*n == 0 && !first) break;
      msg.set_data(buf.data(), *n);
      // A false Write means the call is over; Finish() says why.
      if (!writer->Write(msg)) break;
      msg.Clear();
      if (*n < buf.size()) break;
    }
    writer->WritesDone();
    Status st = FromGrpc(writer->Finish());
    RETURN_IF_ERROR(local);
    if (!st.ok()) return Status(st.code(), absl::StrCat(id, ":", path, ": ", st.message()));
    bytes_ += resp.bytes_written();
    ++files_;
    return absl::OkStatus();
  }

  Status Mkdir(const std::string& id, const std::string& path, uint32_t mode) {
    grpc::ClientContext ctx;
    client_.Prepare(&ctx);
    v1::MkdirRequest req;
    req.set_sandbox_id(id);
    req.set_path(path);
    req.set_mode(mode);
    req.set_parents(true);
    v1::Empty resp;
    Status st = FromGrpc(client_.files().Mkdir(&ctx, req, &resp));
    if (!st.ok()) return Status(st.code(), absl::StrCat(id, ":", path, ": ", st.message()));
    return absl::OkStatus();
  }

  // Host tree `src` (a directory) to remote `dst` (created).
  Status UploadTree(const std::string& src, uint32_t mode, const std::string& id, const std::string& dst, int depth) {
    if (depth > kMaxDepth) {
      return absl::InvalidArgumentError(absl::StrCat(src, ": deeper than ", kMaxDepth));
    }
    RETURN_IF_ERROR(Mkdir(id, dst, mode));
    std::error_code ec;
    std::filesystem::directory_iterator it(src, ec);
    if (ec) return ErrnoToStatus(ec.value(), "opendir(" + src + ")");
    for (; it != std::filesystem::directory_iterator(); it.increment(ec)) {
      std::string child = it->path().string();
      std::string name = it->path().filename().string();
      struct stat st;
      if (::lstat(child.c_str(), &st) != 0) return ErrnoToStatus(errno, "lstat(" + child + ")");
      if (S_ISDIR(st.st_mode)) {
        RETURN_IF_ERROR(UploadTree(child, st.st_mode & 07777, id, Join(dst, name), depth + 1));
      } else if (S_ISREG(st.st_mode)) {
        UniqueFd fd(::open(child.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
        if (!fd.valid()) return ErrnoToStatus(errno, "open(" + child + ")");
        RETURN_IF_ERROR(UploadFile(fd.get(), child, st.st_mode & 07777, id, Join(dst, name)));
      } else {
        Note("skipping " + child + ": not a regular file or directory");
      }
    }
    if (ec) return ErrnoToStatus(ec.value(), "readdir(" + src + ")");
    return absl::OkStatus();
  }

  // Streams remote `path` to `fd`.
  Status ReadInto(const std::string& id, const std::string& path, int fd, const std::string& what) {
    grpc::ClientContext ctx;
    client_.Prepare(&ctx);
    v1::ReadFileRequest req;
    req.set_sandbox_id(id);
    req.set_path(path);
    std::unique_ptr<grpc::ClientReader<v1::ReadFileChunk>> reader = client_.files().Read(&ctx, req);
    v1::ReadFileChunk chunk;
    Status local = absl::OkStatus();
    uint64_t n = 0;
    while (reader->Read(&chunk)) {
      local = WriteAll(fd, chunk.data(), what);
      if (!local.ok()) {
        ctx.TryCancel();
        while (reader->Read(&chunk)) {
        }
        break;
      }
      n += chunk.data().size();
    }
    Status st = FromGrpc(reader->Finish());
    RETURN_IF_ERROR(local);
    if (!st.ok()) return Status(st.code(), absl::StrCat(id, ":", path, ": ", st.message()));
    bytes_ += n;
    ++files_;
    return absl::OkStatus();
  }

  // Remote file to host `target` via a temporary file renamed into place.
  Status DownloadFile(const std::string& id, const std::string& path, uint32_t mode, const std::string& target) {
    std::string tmp = target + ".warren-XXXXXX";
    UniqueFd fd(::mkostemp(tmp.data(), O_CLOEXEC));
    if (!fd.valid()) return ErrnoToStatus(errno, "mkostemp(" + tmp + ")");
    Status st = ReadInto(id, path, fd.get(), tmp);
    if (st.ok() && ::fchmod(fd.get(), mode & 0777) != 0) {
      st = ErrnoToStatus(errno, "fchmod(" + tmp + ")");
    }
    if (st.ok() && ::close(fd.release()) != 0) st = ErrnoToStatus(errno, "close(" + tmp + ")");
    if (st.ok() && ::rename(tmp.c_str(), target.c_str()) != 0) {
      st = ErrnoToStatus(errno, "rename(" + tmp + ", " + target + ")");
    }
    if (!st.ok()) ::unlink(tmp.c_str());
    return st;
  }

  // Remote directory `path` to host directory `target` (created if missing).
  Status DownloadTree(const std::string& id, const std::string& path, uint32_t mode, const std::string& target,
                      int depth) {
    if (depth > kMaxDepth) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": deeper than ", kMaxDepth));
    }
    if (::mkdir(target.c_str(), 0700) != 0 && errno != EEXIST) {
      return ErrnoToStatus(errno, "mkdir(" + target + ")");
    }
    struct stat st;
    if (::lstat(target.c_str(), &st) != 0) return ErrnoToStatus(errno, "lstat(" + target + ")");
    if (!S_ISDIR(st.st_mode)) return ErrnoToStatus(ENOTDIR, "mkdir(" + target + ")");

    grpc::ClientContext ctx;
    client_.Prepare(&ctx);
    v1::ListDirRequest req;
    req.set_sandbox_id(id);
    req.set_path(path);
    v1::ListDirResponse resp;
    Status rpc = FromGrpc(client_.files().ListDir(&ctx, req, &resp));
    if (!rpc.ok()) return Status(rpc.code(), absl::StrCat(id, ":", path, ": ", rpc.message()));
    for (const v1::FileInfo& e : resp.entries()) {
      const std::string& name = e.name();
      if (!IsPlainName(name)) {
        Note(absl::StrCat("skipping ", id, ":", Join(path, name), ": unusable name"));
        continue;
      }
      if (e.type() == v1::FILE_TYPE_DIRECTORY) {
        RETURN_IF_ERROR(DownloadTree(id, Join(path, name), e.mode(), Join(target, name), depth + 1));
      } else if (e.type() == v1::FILE_TYPE_REGULAR) {
        RETURN_IF_ERROR(DownloadFile(id, Join(path, name), e.mode(), Join(target, name)));
      } else {
        Note(absl::StrCat("skipping ", id, ":", Join(path, name), ": not a regular file or directory"));
      }
    }
    if (::chmod(target.c_str(), mode & 0777) != 0) {
      return ErrnoToStatus(errno, "chmod(" + target + ")");
    }
    return absl::OkStatus();
  }

  // Returns the final destination for --json.
  StatusOr<std::string> Upload(const CpEndpoint& src, const CpEndpoint& dst) {
    if (src.path == "-") {
      ASSIGN_OR_RETURN(std::string target, UploadTarget(dst.sandbox_id, dst.path, ""));
      RETURN_IF_ERROR(UploadFile(STDIN_FILENO, "stdin", 0644, dst.sandbox_id, target));
      return target;
    }
    struct stat st;
    if (::stat(src.path.c_str(), &st) != 0) return ErrnoToStatus(errno, "stat(" + src.path + ")");
    if (S_ISDIR(st.st_mode) && !args_.recursive) {
      return absl::InvalidArgumentError(src.path + ": directories: use -r or tar");
    }
    ASSIGN_OR_RETURN(std::string target, UploadTarget(dst.sandbox_id, dst.path, Basename(src.path)));
    if (S_ISDIR(st.st_mode)) {
      RETURN_IF_ERROR(UploadTree(src.path, st.st_mode & 07777, dst.sandbox_id, target, 0));
      return target;
    }
    UniqueFd fd(::open(src.path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) return ErrnoToStatus(errno, "open(" + src.path + ")");
    RETURN_IF_ERROR(UploadFile(fd.get(), src.path, st.st_mode & 07777, dst.sandbox_id, target));
    return target;
  }

  StatusOr<std::string> Download(const CpEndpoint& src, const CpEndpoint& dst) {
    ASSIGN_OR_RETURN(v1::FileInfo info, Stat(src.sandbox_id, src.path));
    bool is_dir = info.type() == v1::FILE_TYPE_DIRECTORY;
    if (is_dir && !args_.recursive) {
      return absl::InvalidArgumentError(absl::StrCat(src.sandbox_id, ":", src.path, ": directories: use -r or tar"));
    }
    if (dst.path == "-") {
      if (is_dir) return absl::InvalidArgumentError("cannot copy a directory to stdout");
      RETURN_IF_ERROR(ReadInto(src.sandbox_id, src.path, STDOUT_FILENO, "stdout"));
      return std::string("-");
    }
    std::string target = dst.path;
    struct stat st;
    if (::stat(target.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      std::string name = Basename(src.path);
      if (IsPlainName(name)) target = Join(target, name);
    }
    if (is_dir) {
      RETURN_IF_ERROR(DownloadTree(src.sandbox_id, src.path, info.mode(), target, 0));
    } else {
      RETURN_IF_ERROR(DownloadFile(src.sandbox_id, src.path, info.mode(), target));
    }
    return target;
  }

 private:
  Client client_;
  const CpArgs& args_;
  uint64_t bytes_ = 0;
  uint64_t files_ = 0;
};

int RunCp(Invocation& inv) {
  StatusOr<std::pair<CpEndpoint, CpEndpoint>> ends = ParseCpArgs(inv.cp.src, inv.cp.dst);
  if (!ends.ok()) return UsageError(ends.status());
  const auto& [src, dst] = *ends;
  Copier copier(inv.global, inv.cp);
  StatusOr<std::string> target = src.remote ? copier.Download(src, dst) : copier.Upload(src, dst);
  if (!target.ok()) {
    PrintError(target.status());
    return kExitError;
  }
  // Downloading to stdout: stdout is the file's bytes, no JSON after them.
  if (inv.global.json && !(src.remote && dst.path == "-")) {
    std::string shown = dst.remote ? absl::StrCat(dst.sandbox_id, ":", *target) : *target;
    PrintJson({{"src", inv.cp.src}, {"dst", shown}, {"files", copier.files()}, {"bytes", copier.bytes()}});
  }
  return kExitOk;
}

}  // namespace

CpEndpoint ParseCpEndpoint(const std::string& arg) {
  size_t colon = arg.find(':');
  size_t slash = arg.find('/');
  if (colon != std::string::npos && colon > 0 && (slash == std::string::npos || colon < slash)) {
    return CpEndpoint{true, arg.substr(0, colon), arg.substr(colon + 1)};
  }
  return CpEndpoint{false, "", arg};
}

StatusOr<std::pair<CpEndpoint, CpEndpoint>> ParseCpArgs(const std::string& src, const std::string& dst) {
  CpEndpoint s = ParseCpEndpoint(src);
  CpEndpoint d = ParseCpEndpoint(dst);
  if (s.remote && d.remote) {
    return absl::InvalidArgumentError("copying between sandboxes is not supported");
  }
  if (!s.remote && !d.remote) {
    return absl::InvalidArgumentError("one side of cp must be ID:/path");
  }
  const CpEndpoint& remote = s.remote ? s : d;
  const CpEndpoint& local = s.remote ? d : s;
  if (remote.path.empty()) {
    return absl::InvalidArgumentError("empty sandbox path in \"" + (s.remote ? src : dst) + "\"");
  }
  if (local.path.empty()) return absl::InvalidArgumentError("empty host path");
  return std::make_pair(s, d);
}

void AddCpCommand(CLI::App& root, Invocation& inv) {
  CLI::App* sub =
      root.add_subcommand("cp",
                          "Copy a file between the host and a sandbox: warren cp SRC DST, one side ID:/path;\n"
                          "'-' is stdin/stdout. Directories need -r.");
  sub->fallthrough();
  sub->add_option("src", inv.cp.src, "source: host path, '-', or ID:/path")->required();
  sub->add_option("dst", inv.cp.dst, "destination: host path, '-', or ID:/path")->required();
  sub->add_flag("-p,--parents", inv.cp.parents, "create missing parent directories remotely");
  sub->add_flag("-r,--recursive", inv.cp.recursive, "copy directories (regular files and directories only)");
  sub->callback([&inv] {
    inv.verb = "cp";
    inv.run = RunCp;
  });
}

}  // namespace warren::cli

#include "guest/agent/files.h"

#include <fcntl.h>

#include <cerrno>

#include "guest/agent/boot.h"
#include "guest/agent/changes.h"
#include "guest/agent/util.h"
#include "runtime/container/rooted_files.h"

namespace warren::guest {
namespace {

namespace proto = runtime::microvm::proto;
using proto::FileOp;

// Handles open at once (writers + readers); more is a host bug or abuse.
constexpr size_t kMaxHandles = 256;
// Bytes of file infos in one List reply, well under kMaxPayload.
constexpr size_t kListReplyBytes = 512u << 10;

proto::WireFileInfo ToWire(const runtime::FileInfo& i) {
  proto::WireFileInfo w;
  w.name = i.name;
  w.path = i.path;
  w.type = static_cast<uint64_t>(i.type);
  w.size = i.size;
  w.mode = i.mode & 07777;
  w.uid = i.uid;
  w.gid = i.gid;
  w.mtime_ns = i.mtime_ns;
  w.symlink_target = i.symlink_target;
  return w;
}

}  // namespace

FileService::FileService() {
  runtime::RootedFilesOptions o;
  // The agent runs chrooted into the sandbox's root: "/" is that root.
  o.open_root = []() -> StatusOr<UniqueFd> {
    UniqueFd fd(::open("/", O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!fd.valid()) return ErrnoToStatus(errno, "open(/)");
    return fd;
  };
  o.host_root_uid = 0;
  o.host_root_gid = 0;
  o.id_range = 0xffffffffu;
  files_ = runtime::NewRootedFiles(std::move(o));
}

FileService::~FileService() = default;

void FileService::Reset() {
  writers_.clear();
  readers_.clear();
  listed_.clear();
  listed_path_.clear();
}

std::pair<proto::FrameType, std::string> FileService::Handle(std::string_view payload) {
  proto::FileRequest req;
  std::string why;
  StatusOr<proto::FileReply> r = absl::InvalidArgumentError("");
  if (!proto::Decode(payload, &req, &why)) {
    r = absl::InvalidArgumentError("file request: " + why);
  } else {
    r = Serve(req);
  }
  if (r.ok()) return {proto::FrameType::kFileReply, proto::Encode(*r)};
  proto::ErrorReply e;
  e.code = static_cast<uint64_t>(r.status().code());
  e.err = static_cast<uint64_t>(StatusErrno(r.status()));
  e.message = std::string(r.status().message()).substr(0, 4096);
  return {proto::FrameType::kError, proto::Encode(e)};
}

StatusOr<proto::FileReply> FileService::Serve(const proto::FileRequest& req) {
  proto::FileReply out;
  auto bad_handle = [&] { return absl::NotFoundError("file handle " + std::to_string(req.handle) + " is not open"); };
  auto new_handle = [&]() -> StatusOr<uint64_t> {
    if (writers_.size() + readers_.size() >= kMaxHandles) {
      return absl::ResourceExhaustedError("more than 256 files open at once");
    }
    return next_handle_++;
  };
  switch (req.op) {
    case FileOp::kStat: {
      ASSIGN_OR_RETURN(runtime::FileInfo i, files_->Stat(req.path));
      out.infos.push_back(ToWire(i));
      return out;
    }
    case FileOp::kList: {
      if (req.offset == 0 || req.path != listed_path_) {
        listed_.clear();
        listed_path_.clear();
        ASSIGN_OR_RETURN(listed_, files_->List(req.path));
        listed_path_ = req.path;
      }
      size_t bytes = 0;
      for (size_t k = req.offset; k < listed_.size(); ++k) {
        if (out.infos.size() >= proto::kMaxListBatch || bytes >= kListReplyBytes) {
          out.more = true;
          break;
        }
        out.infos.push_back(ToWire(listed_[k]));
        bytes += 128 + listed_[k].name.size() + listed_[k].path.size() + listed_[k].symlink_target.size();
      }
      if (!out.more) {
        listed_.clear();
        listed_path_.clear();
      }
      return out;
    }
    case FileOp::kMkdir:
      RETURN_IF_ERROR(files_->Mkdir(req.path, static_cast<uint32_t>(req.mode), req.flag));
      return out;
    case FileOp::kRemove: RETURN_IF_ERROR(files_->Remove(req.path, req.flag)); return out;
    case FileOp::kRename: RETURN_IF_ERROR(files_->Rename(req.path, req.path2)); return out;
    case FileOp::kOpenWrite: {
      ASSIGN_OR_RETURN(uint64_t h, new_handle());
      ASSIGN_OR_RETURN(std::unique_ptr<runtime::FileWriter> w,
                       files_->OpenWrite(req.path, static_cast<uint32_t>(req.mode), req.flag));
      writers_[h] = std::move(w);
      out.handle = h;
      return out;
    }
    case FileOp::kWrite: {
      auto it = writers_.find(req.handle);
      if (it == writers_.end()) return bad_handle();
      Status s = it->second->Write(req.data);
      if (!s.ok()) writers_.erase(it);  // removes its temporary file
      RETURN_IF_ERROR(s);
      return out;
    }
    case FileOp::kCommit: {
      auto it = writers_.find(req.handle);
      if (it == writers_.end()) return bad_handle();
      StatusOr<uint64_t> n = it->second->Commit();
      writers_.erase(it);
      if (!n.ok()) return n.status();
      out.bytes = *n;
      return out;
    }
    case FileOp::kOpenRead: {
      ASSIGN_OR_RETURN(uint64_t h, new_handle());
      ASSIGN_OR_RETURN(std::unique_ptr<runtime::FileReader> r, files_->OpenRead(req.path, req.offset, req.length));
      readers_[h] = std::move(r);
      out.handle = h;
      return out;
    }
    case FileOp::kOpenChanges: {
      ASSIGN_OR_RETURN(uint64_t h, new_handle());
      ASSIGN_OR_RETURN(std::unique_ptr<runtime::FileReader> r,
                       OpenChangesTar(UpperDirFd(), req.flag ? kCgroupRoot : ""));
      readers_[h] = std::move(r);
      out.handle = h;
      return out;
    }
    case FileOp::kRead: {
      auto it = readers_.find(req.handle);
      if (it == readers_.end()) return bad_handle();
      StatusOr<std::string> d = it->second->Read(req.max == 0 ? proto::kMaxChunk : req.max);
      if (!d.ok() || d->empty()) readers_.erase(it);  // end of file or error: the handle is done
      if (!d.ok()) return d.status();
      out.data = std::move(*d);
      return out;
    }
    case FileOp::kClose:
      writers_.erase(req.handle);
      readers_.erase(req.handle);
      return out;
  }
  return absl::InvalidArgumentError("unknown file op");
}

}  // namespace warren::guest

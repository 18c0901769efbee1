#include "runtime/microvm/files.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "runtime/microvm/protocol_calls.h"

namespace warren::runtime::microvm {
namespace {

using proto::FileOp;
using proto::FrameType;
using Ms = std::chrono::milliseconds;

// A listing larger than this is refused (ResourceExhausted) rather than
// held in the daemon's memory.
constexpr size_t kMaxListEntries = 1u << 20;

FileInfo FromWire(proto::WireFileInfo w) {
  FileInfo i;
  i.name = std::move(w.name);
  i.path = std::move(w.path);
  i.type = static_cast<FileType>(w.type);
  i.size = w.size;
  i.mode = static_cast<uint32_t>(w.mode);
  i.uid = static_cast<uint32_t>(w.uid);
  i.gid = static_cast<uint32_t>(w.gid);
  i.mtime_ns = w.mtime_ns;
  i.symlink_target = std::move(w.symlink_target);
  return i;
}

// One request and its decoded reply. `check` states what the reply must
// hold beyond decoding (false + why: a protocol violation).
class Caller {
 public:
  Caller(ChannelSource ch, Ms timeout) : ch_(std::move(ch)), timeout_(timeout) {}

  StatusOr<proto::FileReply> Call(const proto::FileRequest& req,
                                  const std::function<bool(const proto::FileReply&, std::string*)>& check = nullptr) {
    auto valid = [&check](std::string_view payload, std::string* why) {
      proto::FileReply r;
      if (!proto::Decode(payload, &r, why)) return false;
      return !check || check(r, why);
    };
    ASSIGN_OR_RETURN(std::shared_ptr<AgentChannel> ch, ch_());
    ASSIGN_OR_RETURN(std::string payload,
                     ch->Request(FrameType::kFileRequest, proto::Encode(req), FrameType::kFileReply, timeout_, valid));
    proto::FileReply r;
    std::string why;
    (void)proto::Decode(payload, &r, &why);  // validated on delivery
    return r;
  }

 private:
  ChannelSource ch_;
  Ms timeout_;
};

class MicrovmWriter : public FileWriter {
 public:
  MicrovmWriter(Caller c, uint64_t handle, std::string path)
      : c_(std::move(c)), handle_(handle), path_(std::move(path)) {}
  ~MicrovmWriter() override {
    if (handle_ == 0) return;
    proto::FileRequest req;
    req.op = FileOp::kClose;
    req.handle = handle_;
    (void)c_.Call(req);  // drops the temporary file; errors leave it to the sandbox's end
  }

  Status Write(std::string_view data) override {
    if (handle_ == 0) return absl::FailedPreconditionError("write(" + path_ + "): already committed or failed");
    while (!data.empty()) {
      proto::FileRequest req;
      req.op = FileOp::kWrite;
      req.handle = handle_;
      req.data.assign(data.substr(0, proto::kMaxChunk));
      data.remove_prefix(req.data.size());
      StatusOr<proto::FileReply> r = c_.Call(req);
      if (!r.ok()) {
        handle_ = 0;  // the guest dropped the writer with its temporary file
        return r.status();
      }
    }
    return absl::OkStatus();
  }

  StatusOr<uint64_t> Commit() override {
    if (handle_ == 0) return absl::FailedPreconditionError("write(" + path_ + "): already committed or failed");
    proto::FileRequest req;
    req.op = FileOp::kCommit;
    req.handle = std::exchange(handle_, 0);
    ASSIGN_OR_RETURN(proto::FileReply r, c_.Call(req));
    return r.bytes;
  }

 private:
  Caller c_;
  uint64_t handle_;
  std::string path_;
};

class MicrovmReader : public FileReader {
 public:
  MicrovmReader(Caller c, uint64_t handle) : c_(std::move(c)), handle_(handle) {}
  ~MicrovmReader() override {
    if (handle_ == 0) return;
    proto::FileRequest req;
    req.op = FileOp::kClose;
    req.handle = handle_;
    (void)c_.Call(req);
  }

  StatusOr<std::string> Read(size_t max) override {
    if (handle_ == 0 || max == 0) return std::string();
    proto::FileRequest req;
    req.op = FileOp::kRead;
    req.handle = handle_;
    req.max = std::min<uint64_t>(max, proto::kMaxChunk);
    const uint64_t asked = req.max;
    StatusOr<proto::FileReply> r = c_.Call(req, [asked](const proto::FileReply& rep, std::string* why) {
      if (rep.data.size() <= asked) return true;
      *why = "read reply of " + std::to_string(rep.data.size()) + " bytes for " + std::to_string(asked) + " asked";
      return false;
    });
    if (!r.ok() || r->data.empty()) handle_ = 0;  // the guest dropped it at EOF or on error
    if (!r.ok()) return r.status();
    return std::move(r->data);
  }

 private:
  Caller c_;
  uint64_t handle_;
};

bool HasHandle(const proto::FileReply& r, std::string* why) {
  if (r.handle != 0) return true;
  *why = "open reply without a handle";
  return false;
}

class MicrovmFiles : public SandboxFiles {
 public:
  MicrovmFiles(ChannelSource ch, Ms timeout, std::string id) : c_(std::move(ch), timeout), id_(std::move(id)) {}

  StatusOr<std::unique_ptr<FileWriter>> OpenWrite(const std::string& path, uint32_t mode, bool make_parents) override {
    proto::FileRequest req;
    req.op = FileOp::kOpenWrite;
    req.path = path;
    req.mode = mode & 07777;
    req.flag = make_parents;
    RETURN_IF_ERROR(CheckPath(path));
    ASSIGN_OR_RETURN(proto::FileReply r, c_.Call(req, HasHandle));
    return std::unique_ptr<FileWriter>(new MicrovmWriter(c_, r.handle, path));
  }

  StatusOr<std::unique_ptr<FileReader>> OpenRead(const std::string& path, uint64_t offset, uint64_t length) override {
    proto::FileRequest req;
    req.op = FileOp::kOpenRead;
    req.path = path;
    req.offset = offset;
    req.length = length;
    RETURN_IF_ERROR(CheckPath(path));
    ASSIGN_OR_RETURN(proto::FileReply r, c_.Call(req, HasHandle));
    return std::unique_ptr<FileReader>(new MicrovmReader(c_, r.handle));
  }

  StatusOr<FileInfo> Stat(const std::string& path) override {
    proto::FileRequest req;
    req.op = FileOp::kStat;
    req.path = path;
    RETURN_IF_ERROR(CheckPath(path));
    ASSIGN_OR_RETURN(proto::FileReply r, c_.Call(req, [](const proto::FileReply& rep, std::string* why) {
      if (rep.infos.size() == 1) return true;
      *why = "stat reply with " + std::to_string(rep.infos.size()) + " entries";
      return false;
    }));
    return FromWire(std::move(r.infos[0]));
  }

  StatusOr<std::vector<FileInfo>> List(const std::string& path) override {
    RETURN_IF_ERROR(CheckPath(path));
    std::vector<FileInfo> out;
    auto entries_ok = [](const proto::FileReply& rep, std::string* why) {
      for (const proto::WireFileInfo& i : rep.infos) {
        if (i.name.empty() || i.name == "." || i.name == ".." || i.name.find('/') != std::string::npos) {
          *why = "listing holds a bad entry name";
          return false;
        }
      }
      return true;
    };
    while (true) {
      proto::FileRequest req;
      req.op = FileOp::kList;
      req.path = path;
      req.offset = out.size();
      ASSIGN_OR_RETURN(proto::FileReply r, c_.Call(req, entries_ok));
      for (proto::WireFileInfo& i : r.infos) out.push_back(FromWire(std::move(i)));
      if (!r.more) break;
      if (r.infos.empty()) {
        return absl::UnavailableError("sandbox " + id_ + ": list(" + path +
                                      "): the guest announced more entries but sent none");
      }
      if (out.size() > kMaxListEntries) {
        return absl::ResourceExhaustedError("list(" + path + "): more than " + std::to_string(kMaxListEntries) +
                                            " entries");
      }
    }
    return out;
  }

  Status Mkdir(const std::string& path, uint32_t mode, bool parents) override {
    proto::FileRequest req;
    req.op = FileOp::kMkdir;
    req.path = path;
    req.mode = mode & 07777;
    req.flag = parents;
    RETURN_IF_ERROR(CheckPath(path));
    return c_.Call(req).status();
  }

  Status Remove(const std::string& path, bool recursive) override {
    proto::FileRequest req;
    req.op = FileOp::kRemove;
    req.path = path;
    req.flag = recursive;
    RETURN_IF_ERROR(CheckPath(path));
    return c_.Call(req).status();
  }

  Status Rename(const std::string& from, const std::string& to) override {
    proto::FileRequest req;
    req.op = FileOp::kRename;
    req.path = from;
    req.path2 = to;
    RETURN_IF_ERROR(CheckPath(from));
    RETURN_IF_ERROR(CheckPath(to));
    return c_.Call(req).status();
  }

 private:
  // What the wire cannot carry; the guest checks the rest as the container
  // does.
  static Status CheckPath(const std::string& path) {
    if (path.size() > proto::kMaxPathBytes) {
      return absl::InvalidArgumentError("path of " + std::to_string(path.size()) + " bytes is longer than 4096");
    }
    if (path.find('\0') != std::string::npos) return absl::InvalidArgumentError("path holds a NUL byte");
    return absl::OkStatus();
  }

  Caller c_;
  std::string id_;
};

}  // namespace

StatusOr<std::unique_ptr<FileReader>> OpenChangesStream(ChannelSource channel, std::chrono::milliseconds timeout,
                                                        bool freeze) {
  Caller c(std::move(channel), timeout);
  proto::FileRequest req;
  req.op = FileOp::kOpenChanges;
  req.flag = freeze;
  ASSIGN_OR_RETURN(proto::FileReply r, c.Call(req, HasHandle));
  return std::unique_ptr<FileReader>(new MicrovmReader(std::move(c), r.handle));
}

std::unique_ptr<SandboxFiles> NewMicrovmFiles(std::string sandbox_id, ChannelSource channel,
                                              std::chrono::milliseconds timeout) {
  return std::make_unique<MicrovmFiles>(std::move(channel), timeout, std::move(sandbox_id));
}

}  // namespace warren::runtime::microvm

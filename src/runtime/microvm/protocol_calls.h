// Messages of the file calls and long-running processes of the microvm wire
// protocol (frame types 20..31; the conversation is in protocol.h's header
// comment). Header-only, no absl (the guest agent includes it too).
//
// Every Decode* bounds what it accepts: the host decodes the guest's replies
// with them (a hostile guest), the agent the host's requests. A violation
// fails that sandbox's channel only (channel.h).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/microvm/protocol.h"

namespace warren::runtime::microvm::proto {

// Unacknowledged output bytes per stream of a process that the guest may
// have in flight; it stops reading that stream's pipe until the host acks.
constexpr uint64_t kProcWindow = 1u << 20;
// Entries of one List reply; the host asks again from `offset` while `more`.
constexpr size_t kMaxListBatch = 1024;
constexpr size_t kMaxPathBytes = 4096;
constexpr size_t kMaxNameBytes = 255;

enum class FileOp : uint64_t {
  kStat = 1,
  kList = 2,
  kMkdir = 3,
  kRemove = 4,
  kRename = 5,
  kOpenWrite = 6,  // path, mode, flag = make_parents → handle
  kWrite = 7,      // handle, data (at most kMaxChunk)
  kCommit = 8,     // handle → bytes (the handle is gone after)
  kOpenRead = 9,   // path, offset, length → handle
  kRead = 10,      // handle, max (at most kMaxChunk) → data ("" = end of file)
  kClose = 11,     // handle: drops a reader, or a writer with its temporary file
  // flag = freeze the commands while open → handle, read with kRead: the
  // sandbox's changes (the overlay's upper dir) as a pax tar stream in the
  // OCI whiteout convention (src/guest/agent/changes.h); untrusted on the host
  kOpenChanges = 12,
};
constexpr uint64_t kMaxFileOp = 12;

struct FileRequest {
  FileOp op = FileOp::kStat;
  std::string path, path2;
  uint64_t mode = 0;
  bool flag = false;  // make_parents / recursive / parents
  uint64_t offset = 0, length = 0;
  uint64_t handle = 0;
  uint64_t max = 0;
  std::string data;
};

struct WireFileInfo {
  std::string name, path;
  uint64_t type = 3;  // runtime::FileType: 0 regular, 1 directory, 2 symlink, 3 other
  uint64_t size = 0, mode = 0, uid = 0, gid = 0;
  int64_t mtime_ns = 0;
  std::string symlink_target;
};

struct FileReply {
  std::vector<WireFileInfo> infos;  // Stat: one; List: a batch
  bool more = false;                // List: entries after this batch
  uint64_t handle = 0;              // OpenWrite/OpenRead
  uint64_t bytes = 0;               // Commit
  std::string data;                 // Read
};

struct ProcStarted {
  uint64_t pid = 0;  // in the guest
};
struct ProcSignal {
  uint64_t signal = 0;  // 1..64
  bool whole_tree = false;
};
struct ProcResize {
  uint64_t rows = 0, cols = 0;  // 1..65535
};
struct ProcAck {
  uint64_t bytes = 0;
};

namespace ctag {
enum : uint16_t {
  // FileRequest
  kOp = 1,
  kPath = 2,
  kPath2 = 3,
  kMode = 4,
  kFlag = 5,
  kOffset = 6,
  kLength = 7,
  kHandle = 8,
  kMax = 9,
  kData = 10,
  // FileReply (kHandle, kData as above)
  kInfo = 11,
  kMore = 12,
  kBytes = 13,
  // WireFileInfo (nested in kInfo)
  kName = 1,
  kInfoPath = 2,
  kType = 3,
  kSize = 4,
  kInfoMode = 5,
  kUid = 6,
  kGid = 7,
  kMtimeNs = 8,
  kTarget = 9,
  // ProcStarted, ProcSignal, ProcResize, ProcAck
  kPid = 1,
  kSignal = 2,
  kWholeTree = 3,
  kRows = 4,
  kCols = 5,
  kAckBytes = 6,
};
}  // namespace ctag

inline std::string Encode(const FileRequest& m) {
  TlvWriter w;
  w.U64(ctag::kOp, static_cast<uint64_t>(m.op));
  if (!m.path.empty()) w.Bytes(ctag::kPath, m.path);
  if (!m.path2.empty()) w.Bytes(ctag::kPath2, m.path2);
  w.U64(ctag::kMode, m.mode).U64(ctag::kFlag, m.flag ? 1 : 0);
  w.U64(ctag::kOffset, m.offset).U64(ctag::kLength, m.length).U64(ctag::kHandle, m.handle).U64(ctag::kMax, m.max);
  if (!m.data.empty()) w.Bytes(ctag::kData, m.data);
  return w.Take();
}

inline std::string Encode(const WireFileInfo& m) {
  return TlvWriter()
      .Bytes(ctag::kName, m.name)
      .Bytes(ctag::kInfoPath, m.path)
      .U64(ctag::kType, m.type)
      .U64(ctag::kSize, m.size)
      .U64(ctag::kInfoMode, m.mode)
      .U64(ctag::kUid, m.uid)
      .U64(ctag::kGid, m.gid)
      .U64(ctag::kMtimeNs, static_cast<uint64_t>(m.mtime_ns))
      .Bytes(ctag::kTarget, m.symlink_target)
      .Take();
}

inline std::string Encode(const FileReply& m) {
  TlvWriter w;
  for (const WireFileInfo& i : m.infos) w.Bytes(ctag::kInfo, Encode(i));
  if (m.more) w.U64(ctag::kMore, 1);
  if (m.handle != 0) w.U64(ctag::kHandle, m.handle);
  w.U64(ctag::kBytes, m.bytes);
  if (!m.data.empty()) w.Bytes(ctag::kData, m.data);
  return w.Take();
}

inline std::string Encode(const ProcStarted& m) { return TlvWriter().U64(ctag::kPid, m.pid).Take(); }
inline std::string Encode(const ProcSignal& m) {
  return TlvWriter().U64(ctag::kSignal, m.signal).U64(ctag::kWholeTree, m.whole_tree ? 1 : 0).Take();
}
inline std::string Encode(const ProcResize& m) {
  return TlvWriter().U64(ctag::kRows, m.rows).U64(ctag::kCols, m.cols).Take();
}
inline std::string Encode(const ProcAck& m) { return TlvWriter().U64(ctag::kAckBytes, m.bytes).Take(); }

namespace internal {
inline bool Path(std::string_view v, std::string* out, std::string* why, const char* name) {
  if (v.size() > kMaxPathBytes) return *why = std::string(name) + " longer than 4096 bytes", false;
  if (v.find('\0') != std::string_view::npos) return *why = std::string(name) + " holds a NUL byte", false;
  out->assign(v);
  return true;
}
}  // namespace internal

inline bool Decode(std::string_view payload, FileRequest* m, std::string* why) {
  TlvReader r(payload);
  uint16_t t;
  std::string_view v;
  uint64_t x = 0;
  bool have_op = false;
  while (r.Next(&t, &v)) {
    bool ok = true;
    switch (t) {
      case ctag::kOp:
        ok = internal::Int(v, &x, why, "op");
        if (ok && (x < 1 || x > kMaxFileOp)) return *why = "unknown file op " + std::to_string(x), false;
        m->op = static_cast<FileOp>(x);
        have_op = true;
        break;
      case ctag::kPath: ok = internal::Path(v, &m->path, why, "path"); break;
      case ctag::kPath2: ok = internal::Path(v, &m->path2, why, "path2"); break;
      case ctag::kMode:
        ok = internal::Int(v, &m->mode, why, "mode");
        if (ok && m->mode > 07777) return *why = "mode out of range", false;
        break;
      case ctag::kFlag:
        ok = internal::Int(v, &x, why, "flag");
        m->flag = x != 0;
        break;
      case ctag::kOffset: ok = internal::Int(v, &m->offset, why, "offset"); break;
      case ctag::kLength: ok = internal::Int(v, &m->length, why, "length"); break;
      case ctag::kHandle: ok = internal::Int(v, &m->handle, why, "handle"); break;
      case ctag::kMax:
        ok = internal::Int(v, &m->max, why, "max");
        if (ok && m->max > kMaxChunk) return *why = "read of more than one chunk", false;
        break;
      case ctag::kData:
        if (v.size() > kMaxChunk) return *why = "data of more than one chunk", false;
        m->data.assign(v);
        break;
      default: break;
    }
    if (!ok) return false;
  }
  if (!internal::Done(r, why)) return false;
  if (!have_op) return *why = "file request without an op", false;
  return true;
}

inline bool Decode(std::string_view payload, WireFileInfo* m, std::string* why) {
  TlvReader r(payload);
  uint16_t t;
  std::string_view v;
  uint64_t x = 0;
  while (r.Next(&t, &v)) {
    bool ok = true;
    switch (t) {
      case ctag::kName:
        if (v.size() > kMaxNameBytes) return *why = "file name longer than 255 bytes", false;
        m->name.assign(v);
        break;
      case ctag::kInfoPath: ok = internal::Path(v, &m->path, why, "info path"); break;
      case ctag::kTarget: ok = internal::Path(v, &m->symlink_target, why, "symlink target"); break;
      case ctag::kType:
        ok = internal::Int(v, &m->type, why, "type");
        if (ok && m->type > 3) return *why = "file type " + std::to_string(m->type) + " out of range", false;
        break;
      case ctag::kSize: ok = internal::Int(v, &m->size, why, "size"); break;
      case ctag::kInfoMode:
        ok = internal::Int(v, &m->mode, why, "mode");
        if (ok && m->mode > 07777) return *why = "mode out of range", false;
        break;
      case ctag::kUid:
      case ctag::kGid:
        ok = internal::Int(v, &x, why, "owner");
        if (ok && x > 0xffffffffu) return *why = "owner id out of range", false;
        (t == ctag::kUid ? m->uid : m->gid) = x;
        break;
      case ctag::kMtimeNs:
        ok = internal::Int(v, &x, why, "mtime");
        m->mtime_ns = static_cast<int64_t>(x);
        break;
      default: break;
    }
    if (!ok) return false;
  }
  return internal::Done(r, why);
}

inline bool Decode(std::string_view payload, FileReply* m, std::string* why) {
  TlvReader r(payload);
  uint16_t t;
  std::string_view v;
  uint64_t x = 0;
  while (r.Next(&t, &v)) {
    bool ok = true;
    switch (t) {
      case ctag::kInfo: {
        if (m->infos.size() >= kMaxListBatch) return *why = "more than 1024 entries in one reply", false;
        WireFileInfo i;
        if (!Decode(v, &i, why)) return *why = "file info: " + *why, false;
        m->infos.push_back(std::move(i));
        break;
      }
      case ctag::kMore:
        ok = internal::Int(v, &x, why, "more");
        m->more = x != 0;
        break;
      case ctag::kHandle: ok = internal::Int(v, &m->handle, why, "handle"); break;
      case ctag::kBytes: ok = internal::Int(v, &m->bytes, why, "bytes"); break;
      case ctag::kData:
        if (v.size() > kMaxChunk) return *why = "data of more than one chunk", false;
        m->data.assign(v);
        break;
      default: break;
    }
    if (!ok) return false;
  }
  return internal::Done(r, why);
}

inline bool Decode(std::string_view payload, ProcStarted* m, std::string* why) {
  TlvReader r(payload);
  uint16_t t;
  std::string_view v;
  while (r.Next(&t, &v)) {
    if (t == ctag::kPid && !internal::Int(v, &m->pid, why, "pid")) return false;
  }
  if (!internal::Done(r, why)) return false;
  if (m->pid < 1 || m->pid > (1u << 22)) return *why = "pid " + std::to_string(m->pid) + " out of range", false;
  return true;
}

inline bool Decode(std::string_view payload, ProcSignal* m, std::string* why) {
  TlvReader r(payload);
  uint16_t t;
  std::string_view v;
  uint64_t x = 0;
  while (r.Next(&t, &v)) {
    if (t == ctag::kSignal && !internal::Int(v, &m->signal, why, "signal")) return false;
    if (t == ctag::kWholeTree) {
      if (!internal::Int(v, &x, why, "whole_tree")) return false;
      m->whole_tree = x != 0;
    }
  }
  if (!internal::Done(r, why)) return false;
  if (m->signal < 1 || m->signal > 64) return *why = "signal " + std::to_string(m->signal) + " out of range", false;
  return true;
}

inline bool Decode(std::string_view payload, ProcResize* m, std::string* why) {
  TlvReader r(payload);
  uint16_t t;
  std::string_view v;
  while (r.Next(&t, &v)) {
    if (t == ctag::kRows && !internal::Int(v, &m->rows, why, "rows")) return false;
    if (t == ctag::kCols && !internal::Int(v, &m->cols, why, "cols")) return false;
  }
  if (!internal::Done(r, why)) return false;
  if (m->rows < 1 || m->rows > 65535 || m->cols < 1 || m->cols > 65535) return *why = "size out of range", false;
  return true;
}

inline bool Decode(std::string_view payload, ProcAck* m, std::string* why) {
  TlvReader r(payload);
  uint16_t t;
  std::string_view v;
  while (r.Next(&t, &v)) {
    if (t == ctag::kAckBytes && !internal::Int(v, &m->bytes, why, "bytes")) return false;
  }
  if (!internal::Done(r, why)) return false;
  if (m->bytes > kProcWindow) return *why = "ack beyond the window", false;
  return true;
}

}  // namespace warren::runtime::microvm::proto

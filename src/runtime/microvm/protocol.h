// The wire protocol between warrend (host) and the guest agent
// (src/guest/agent) of a microvm sandbox, over one virtio-serial port
// ("warren.agent"; a unix socket on the host side). Header-only, plain C++
// (no absl: the agent is a small static binary and includes this file too).
//
// Stream: a sequence of FRAMES, each a 16-byte header then `length` bytes of
// payload, all integers little-endian:
//
//   u32 length   payload bytes, at most kMaxPayload
//   u16 type     FrameType
//   u16 flags    per type (kOutput: the stream, 1 = stdout, 2 = stderr); else 0
//   u64 id       request id, chosen by the host; every frame answering or
//                belonging to a request carries its id
//
// Payloads of structured frames are TLV records: u16 tag, u32 size, bytes.
// Integers are 8-byte records; a repeated field repeats its tag; unknown tags
// are skipped (a newer peer may add fields).
//
// Conversation (host → guest ⇒, guest → host ⇐):
//   ⇒ kHello {realtime_ns, seed, setup_root, layers, hostname, shm_mb, pids,
//             template_root, net}
//                                   first frame on every connection; the agent
//                                   sets its clock, mixes `seed` into the RNG
//                                   with credit and forces a reseed. A guest
//                                   booted as a template (warren.template=1)
//                                   has no root yet: the first hello with
//                                   setup_root=1 (a clone's, after restore)
//                                   sets the hostname, binds the disks and
//                                   mounts the root from `layers`, `shm_mb`;
//                                   later hellos leave both alone.
//                                   With template_root=1 too (a template
//                                   with its root, made from a clone of a
//                                   bare template): the root is mounted but
//                                   boot_id is not read, and the next hello
//                                   with setup_root=1 (a clone of THAT
//                                   template) sets only the hostname, the
//                                   /dev/shm size and the task limit.
//                                   `net` {addr, prefix, gateway, mac,
//                                   nameserver} (a sandbox with a network):
//                                   the first hello carrying it configures
//                                   eth0 (MAC, address, default route) and
//                                   /etc/resolv.conf once the root is up;
//                                   later ones leave it alone
//   ⇐ kHelloReply {version, kernel_release, boot_id, error, nic}  same id. A
//                                   non-empty `error`: the guest could not set
//                                   up its root (the sandbox is unusable).
//   ⇒ kPing ⇐ kPong                 liveness
//   ⇒ kExec {argv | shell, env, cwd, user, timeouts, cap, stdin_follows}
//   ⇒ kStdin (raw bytes)*, kStdin (empty = EOF)   iff stdin_follows
//   ⇐ kOutput (raw bytes, flags = stream)*        at most `output_cap` bytes
//                                                 per stream, in order
//   ⇐ kExit {exit_code, signal, timed_out, totals, duration}  last frame of it
//   ⇐ kError {code, errno, message}               instead of kExit when the
//                                                 command could not start (bad
//                                                 cwd or user) or the request
//                                                 was malformed
//   File calls and long-running processes (types 20..33; messages in
//   protocol_calls.h):
//   ⇒ kFileRequest {op, ...} ⇐ kFileReply {...} | kError   one reply each
//   ⇒ kProcStart {exec fields, pty, rows, cols, control} ⇐ kProcStarted {pid}
//                                   | kError; the id names the process after
//   ⇒ kProcStdin (raw)*, kProcStdin (empty = EOF)
//   ⇐ kProcOutput (raw, flags = stream 1..3; empty = that stream's EOF)
//   ⇒ kProcAck {bytes} (flags = stream)   credit: the guest keeps at most
//                                   kProcWindow bytes per stream unacknowledged
//   ⇒ kProcSignal {signal, whole_tree}, kProcResize {rows, cols}
//   ⇐ kProcExit {ExitResult} once the foreground was reaped; ⇐ kProcTreeEmpty
//                                   once no process of its tree is left
//   ⇒ kProcRelease                  the host forgets it (nothing is killed)
//   ⇒ kInterrupts ⇐ kInterruptsReply (the text of the guest's
//                                   /proc/interrupts, at most 256 KiB) | kError:
//                                   the vm backend paces typed keys by the
//                                   i8042 count (vm/key_pacer.h); the file API
//                                   does not reach /proc
//
// Trust: the host treats every guest frame as untrusted (a guest kernel or
// process may be hostile). FrameDecoder bounds the payload size and rejects
// unknown types and flags; the Decode* functions below reject records whose
// sizes or values are out of range. Any violation fails that sandbox's
// channel only. After a reconnect (daemon restart) the host discards bytes up
// to the kHelloReply carrying its fresh random id (a frame cut when the
// previous connection closed may precede it): see FindHelloReply.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace warren::runtime::microvm::proto {

// 2: file calls and processes (types 20..31); a version-1 agent cannot
// parse them, so warrend refuses it at hello (rebuild the initramfs).
// 3: kInterrupts (types 32..33).
constexpr uint32_t kVersion = 3;
constexpr size_t kHeaderSize = 16;
// Largest payload either side sends; a guest frame above it is a protocol
// violation (chunks of output and stdin are at most kMaxChunk).
constexpr uint32_t kMaxPayload = 1u << 20;
constexpr size_t kMaxChunk = 64u << 10;
// Bounds of structured fields (exec requests come from the host, replies
// from the guest: both sides check).
constexpr size_t kMaxStringField = 64u << 10;
constexpr size_t kMaxRepeated = 4096;

enum class FrameType : uint16_t {
  kHello = 1,
  kHelloReply = 2,
  kPing = 3,
  kPong = 4,
  kExec = 5,
  kStdin = 6,
  kOutput = 7,
  kExit = 8,
  kError = 9,
  // File calls and processes (protocol_calls.h).
  kFileRequest = 20,
  kFileReply = 21,
  kProcStart = 22,
  kProcStarted = 23,
  kProcStdin = 24,
  kProcOutput = 25,
  kProcAck = 26,
  kProcSignal = 27,
  kProcResize = 28,
  kProcExit = 29,
  kProcTreeEmpty = 30,
  kProcRelease = 31,
  kInterrupts = 32,
  kInterruptsReply = 33,
};
constexpr uint16_t kMaxFrameType = 9;
constexpr uint16_t kFirstCallFrameType = 20, kLastCallFrameType = 33;
constexpr uint16_t kStreamStdout = 1;
constexpr uint16_t kStreamStderr = 2;
constexpr uint16_t kStreamControl = 3;  // a process's fd 3 (StartOptions::control_fd)

inline bool KnownFrameType(uint16_t type) {
  return (type >= 1 && type <= kMaxFrameType) || (type >= kFirstCallFrameType && type <= kLastCallFrameType);
}
// The flags a frame of `type` may carry.
inline bool ValidFlags(uint16_t type, uint16_t flags) {
  if (type == static_cast<uint16_t>(FrameType::kOutput)) return flags == kStreamStdout || flags == kStreamStderr;
  if (type == static_cast<uint16_t>(FrameType::kProcOutput) || type == static_cast<uint16_t>(FrameType::kProcAck)) {
    return flags >= kStreamStdout && flags <= kStreamControl;
  }
  return flags == 0;
}

struct Frame {
  FrameType type = FrameType::kPing;
  uint16_t flags = 0;
  uint64_t id = 0;
  std::string payload;
};

// ---- little-endian primitives

inline void PutLe(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
inline uint64_t GetLe(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

// Header + payload. The caller keeps payload.size() <= kMaxPayload.
inline std::string EncodeFrame(FrameType type, uint16_t flags, uint64_t id, std::string_view payload) {
  std::string out;
  out.reserve(kHeaderSize + payload.size());
  PutLe(out, payload.size(), 4);
  PutLe(out, static_cast<uint16_t>(type), 2);
  PutLe(out, flags, 2);
  PutLe(out, id, 8);
  out.append(payload);
  return out;
}

// Incremental decoder of a byte stream into frames. Feed() appends bytes;
// Next() returns the next whole frame, nothing while one is incomplete, or
// an error (then the stream is unusable: the decoder stays failed).
class FrameDecoder {
 public:
  enum class Result { kFrame, kNeedMore, kError };

  void Feed(std::string_view bytes) { buf_.append(bytes); }

  Result Next(Frame* out) {
    if (!error_.empty()) return Result::kError;
    if (buf_.size() - pos_ < kHeaderSize) return Compact(), Result::kNeedMore;
    const char* h = buf_.data() + pos_;
    uint64_t length = GetLe(h, 4);
    uint16_t type = static_cast<uint16_t>(GetLe(h + 4, 2));
    uint16_t flags = static_cast<uint16_t>(GetLe(h + 6, 2));
    if (length > kMaxPayload) {
      return Fail("frame of " + std::to_string(length) + " bytes exceeds the maximum of " +
                  std::to_string(kMaxPayload));
    }
    if (!KnownFrameType(type)) return Fail("unknown frame type " + std::to_string(type));
    if (!ValidFlags(type, flags)) {
      if (type == static_cast<uint16_t>(FrameType::kOutput)) {
        return Fail("output frame with stream " + std::to_string(flags));
      }
      return Fail("frame type " + std::to_string(type) + " with flags " + std::to_string(flags));
    }
    if (buf_.size() - pos_ < kHeaderSize + length) return Compact(), Result::kNeedMore;
    out->type = static_cast<FrameType>(type);
    out->flags = flags;
    out->id = GetLe(h + 8, 8);
    out->payload.assign(h + kHeaderSize, length);
    pos_ += kHeaderSize + length;
    return Result::kFrame;
  }

  const std::string& error() const { return error_; }
  // Bytes fed but not yet returned as frames (a truncated frame at EOF).
  size_t pending() const { return buf_.size() - pos_; }

 private:
  Result Fail(std::string why) {
    error_ = std::move(why);
    return Result::kError;
  }
  void Compact() {
    if (pos_ > 0) {
      buf_.erase(0, pos_);
      pos_ = 0;
    }
  }
  std::string buf_;
  size_t pos_ = 0;
  std::string error_;
};

// Offset in `bytes` where a kHelloReply header with request id `id` starts,
// or std::string::npos. Used once per connection to skip what a previous
// connection left in flight; a 64-bit random id makes a false match in the
// skipped bytes negligible.
inline size_t FindHelloReply(std::string_view bytes, uint64_t id) {
  std::string key;
  PutLe(key, static_cast<uint16_t>(FrameType::kHelloReply), 2);
  PutLe(key, 0, 2);
  PutLe(key, id, 8);
  size_t at = bytes.size() < 4 ? std::string_view::npos : bytes.find(key, 4);
  return at == std::string_view::npos ? at : at - 4;
}

// ---- TLV records

class TlvWriter {
 public:
  TlvWriter& Bytes(uint16_t tag, std::string_view v) {
    PutLe(out_, tag, 2);
    PutLe(out_, v.size(), 4);
    out_.append(v);
    return *this;
  }
  TlvWriter& U64(uint16_t tag, uint64_t v) {
    std::string b;
    PutLe(b, v, 8);
    return Bytes(tag, b);
  }
  const std::string& str() const { return out_; }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

class TlvReader {
 public:
  explicit TlvReader(std::string_view in) : in_(in) {}
  // The next record; false at the end or on a malformed record (then
  // error() is set).
  bool Next(uint16_t* tag, std::string_view* value) {
    if (in_.empty()) return false;
    if (in_.size() < 6) return Fail("truncated record header");
    *tag = static_cast<uint16_t>(GetLe(in_.data(), 2));
    uint64_t size = GetLe(in_.data() + 2, 4);
    if (size > in_.size() - 6) return Fail("record of tag " + std::to_string(*tag) + " overruns its frame");
    *value = in_.substr(6, size);
    in_.remove_prefix(6 + size);
    return true;
  }
  const std::string& error() const { return error_; }

 private:
  bool Fail(std::string why) {
    error_ = std::move(why);
    in_ = {};
    return false;
  }
  std::string_view in_;
  std::string error_;
};

// An 8-byte integer record; false for any other size.
inline bool ReadU64(std::string_view v, uint64_t* out) {
  if (v.size() != 8) return false;
  *out = GetLe(v.data(), 8);
  return true;
}

// ---- messages

struct Hello {
  uint64_t realtime_ns = 0;
  std::string seed;  // mixed into the guest RNG; at most 512 bytes
  bool setup_root = false;
  uint64_t layers = 0;   // 1..64 with setup_root
  std::string hostname;  // [A-Za-z0-9.-], at most 64 bytes
  uint64_t shm_mb = 64;
  uint64_t pids = 0;  // with setup_root: task limit of the commands (0: none)
  // The guest's NIC (eth0), when the sandbox has a network; addresses in
  // host byte order. addr == 0: none.
  uint32_t net_addr = 0;
  uint32_t net_prefix = 0;   // 8..30
  uint32_t net_gateway = 0;  // in the /prefix of addr, not addr
  std::string net_mac;       // 6 bytes, unicast
  uint32_t nameserver = 0;   // 0: resolv.conf left alone
  // With setup_root: this guest is saved as a template with its root
  // mounted (its clones send setup_root again, for their identity).
  bool template_root = false;
};
struct HelloReply {
  uint64_t version = 0;
  std::string kernel_release;
  std::string boot_id;
  std::string error;  // non-empty: guest setup failed
  bool nic = false;   // eth0 configured from a hello (an older agent never says so)
};
struct ExecRequest {
  std::vector<std::string> argv;
  std::optional<std::string> shell;
  std::vector<std::string> env;  // "NAME=value", the full environment
  std::string cwd;               // absolute
  std::string user;              // "root", "name", "uid" or "uid:gid"
  uint64_t timeout_ms = 0;       // 0 = none
  uint64_t kill_grace_ms = 500;
  uint64_t output_cap = 16u << 20;  // per stream
  bool stdin_follows = false;
  // kProcStart only (protocol_calls.h): a pty as stdio, its size, fd 3.
  bool pty = false;
  uint64_t rows = 24, cols = 80;
  bool control_fd = false;
};
struct ExitResult {
  int64_t exit_code = 0;  // 0..255, or 128 + signal
  uint32_t signal = 0;    // 0..64
  bool timed_out = false;
  bool oom_killed = false;
  uint64_t stdout_total = 0, stderr_total = 0;
  uint64_t duration_ns = 0;
};
struct ErrorReply {
  uint64_t code = 0;  // absl::StatusCode number
  uint64_t err = 0;   // errno, 0 if none
  std::string message;
};

namespace tag {
enum : uint16_t {
  // Hello
  kRealtimeNs = 1,
  kSeed = 2,
  kSetupRoot = 3,
  kLayers = 4,
  kHostname = 5,
  kShmMb = 6,
  kPids = 7,
  kNetAddr = 16,  // 16..20: the NIC (tags 8..15 left for the root's)
  kNetPrefix = 17,
  kNetGateway = 18,
  kNetMac = 19,
  kNameserver = 20,
  kTemplateRoot = 8,
  // HelloReply
  kVersion = 1,
  kKernelRelease = 2,
  kBootId = 3,
  kSetupError = 4,
  kNic = 16,
  // ExecRequest
  kArgv = 1,
  kShell = 2,
  kEnv = 3,
  kCwd = 4,
  kUser = 5,
  kTimeoutMs = 6,
  kKillGraceMs = 7,
  kOutputCap = 8,
  kStdinFollows = 9,
  kPty = 10,
  kRows = 11,
  kCols = 12,
  kControlFd = 13,
  // ExitResult
  kExitCode = 1,
  kSignal = 2,
  kTimedOut = 3,
  kOomKilled = 4,
  kStdoutTotal = 5,
  kStderrTotal = 6,
  kDurationNs = 7,
  // ErrorReply
  kCode = 1,
  kErrno = 2,
  kMessage = 3,
};
}  // namespace tag

inline std::string Encode(const Hello& m) {
  TlvWriter w;
  w.U64(tag::kRealtimeNs, m.realtime_ns).Bytes(tag::kSeed, m.seed);
  if (m.setup_root) {
    w.U64(tag::kSetupRoot, 1).U64(tag::kLayers, m.layers).Bytes(tag::kHostname, m.hostname).U64(tag::kShmMb, m.shm_mb);
    if (m.pids != 0) w.U64(tag::kPids, m.pids);
    if (m.template_root) w.U64(tag::kTemplateRoot, 1);
  }
  if (m.net_addr != 0) {
    w.U64(tag::kNetAddr, m.net_addr).U64(tag::kNetPrefix, m.net_prefix).U64(tag::kNetGateway, m.net_gateway);
    w.Bytes(tag::kNetMac, m.net_mac).U64(tag::kNameserver, m.nameserver);
  }
  return w.Take();
}
inline std::string Encode(const HelloReply& m) {
  return TlvWriter()
      .U64(tag::kVersion, m.version)
      .Bytes(tag::kKernelRelease, m.kernel_release)
      .Bytes(tag::kBootId, m.boot_id)
      .Bytes(tag::kSetupError, m.error)
      .U64(tag::kNic, m.nic ? 1 : 0)
      .Take();
}
inline std::string Encode(const ExecRequest& m) {
  TlvWriter w;
  for (const std::string& a : m.argv) w.Bytes(tag::kArgv, a);
  if (m.shell) w.Bytes(tag::kShell, *m.shell);
  for (const std::string& e : m.env) w.Bytes(tag::kEnv, e);
  w.Bytes(tag::kCwd, m.cwd).Bytes(tag::kUser, m.user);
  w.U64(tag::kTimeoutMs, m.timeout_ms).U64(tag::kKillGraceMs, m.kill_grace_ms).U64(tag::kOutputCap, m.output_cap);
  w.U64(tag::kStdinFollows, m.stdin_follows ? 1 : 0);
  if (m.pty) w.U64(tag::kPty, 1).U64(tag::kRows, m.rows).U64(tag::kCols, m.cols);
  if (m.control_fd) w.U64(tag::kControlFd, 1);
  return w.Take();
}
inline std::string Encode(const ExitResult& m) {
  return TlvWriter()
      .U64(tag::kExitCode, static_cast<uint64_t>(m.exit_code))
      .U64(tag::kSignal, m.signal)
      .U64(tag::kTimedOut, m.timed_out ? 1 : 0)
      .U64(tag::kOomKilled, m.oom_killed ? 1 : 0)
      .U64(tag::kStdoutTotal, m.stdout_total)
      .U64(tag::kStderrTotal, m.stderr_total)
      .U64(tag::kDurationNs, m.duration_ns)
      .Take();
}
inline std::string Encode(const ErrorReply& m) {
  return TlvWriter().U64(tag::kCode, m.code).U64(tag::kErrno, m.err).Bytes(tag::kMessage, m.message).Take();
}

// Decoders: false with *why set when the payload is malformed or a field is
// out of range.
namespace internal {
inline bool String(std::string_view v, std::string* out, std::string* why, const char* name) {
  if (v.size() > kMaxStringField) {
    *why = std::string(name) + " of " + std::to_string(v.size()) + " bytes is too long";
    return false;
  }
  out->assign(v);
  return true;
}
inline bool Int(std::string_view v, uint64_t* out, std::string* why, const char* name) {
  if (!ReadU64(v, out)) {
    *why = std::string(name) + " is not an 8-byte integer";
    return false;
  }
  return true;
}
inline bool Done(const TlvReader& r, std::string* why) {
  if (!r.error().empty()) {
    *why = r.error();
    return false;
  }
  return true;
}
}  // namespace internal

inline bool Decode(std::string_view payload, Hello* m, std::string* why) {
  TlvReader r(payload);
  uint16_t t;
  std::string_view v;
  while (r.Next(&t, &v)) {
    if (t == tag::kRealtimeNs && !internal::Int(v, &m->realtime_ns, why, "realtime_ns")) return false;
    if (t == tag::kSeed) {
      if (v.size() > 512) return *why = "seed too long", false;
      m->seed.assign(v);
    }
    uint64_t setup = 0;
    if (t == tag::kSetupRoot) {
      if (!internal::Int(v, &setup, why, "setup_root")) return false;
      m->setup_root = setup != 0;
    }
    if (t == tag::kLayers && !internal::Int(v, &m->layers, why, "layers")) return false;
    if (t == tag::kShmMb && !internal::Int(v, &m->shm_mb, why, "shm_mb")) return false;
    if (t == tag::kPids && !internal::Int(v, &m->pids, why, "pids")) return false;
    if (t == tag::kNetAddr || t == tag::kNetPrefix || t == tag::kNetGateway || t == tag::kNameserver) {
      uint64_t x = 0;
      if (!internal::Int(v, &x, why, "net field")) return false;
      if (x > 0xffffffffu) return *why = "net field out of range", false;
      const auto x32 = static_cast<uint32_t>(x);
      (t == tag::kNetAddr      ? m->net_addr
       : t == tag::kNetPrefix  ? m->net_prefix
       : t == tag::kNetGateway ? m->net_gateway
                               : m->nameserver) = x32;
    }
    if (t == tag::kNetMac) {
      if (v.size() != 6) return *why = "net mac must be 6 bytes", false;
      m->net_mac.assign(v);
    }
    if (t == tag::kTemplateRoot) {
      uint64_t on = 0;
      if (!internal::Int(v, &on, why, "template_root")) return false;
      m->template_root = on != 0;
    }
    if (t == tag::kHostname) {
      if (v.size() > 64) return *why = "hostname too long", false;
      for (char c : v) {
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '.')) {
          return *why = "hostname holds a character outside [A-Za-z0-9.-]", false;
        }
      }
      m->hostname.assign(v);
    }
  }
  if (!internal::Done(r, why)) return false;
  if (m->setup_root && (m->layers < 1 || m->layers > 64)) return *why = "layers must be 1..64", false;
  if (m->net_addr != 0) {
    if (m->net_prefix < 8 || m->net_prefix > 30) return *why = "net prefix must be 8..30", false;
    const uint32_t mask = ~uint32_t{0} << (32 - m->net_prefix);
    if (m->net_gateway == m->net_addr || (m->net_gateway & mask) != (m->net_addr & mask))
      return *why = "net gateway outside the NIC's subnet", false;
    if (m->net_mac.size() != 6 || (m->net_mac[0] & 1) != 0) return *why = "net mac must be 6 bytes, unicast", false;
  }
  if (m->setup_root && (m->shm_mb < 1 || m->shm_mb > (1u << 20))) return *why = "shm_mb out of range", false;
  return true;
}

inline bool Decode(std::string_view payload, HelloReply* m, std::string* why) {
  TlvReader r(payload);
  uint16_t t;
  std::string_view v;
  while (r.Next(&t, &v)) {
    bool ok = true;
    if (t == tag::kVersion) ok = internal::Int(v, &m->version, why, "version");
    if (t == tag::kKernelRelease) ok = internal::String(v, &m->kernel_release, why, "kernel_release");
    if (t == tag::kBootId) ok = internal::String(v, &m->boot_id, why, "boot_id");
    if (t == tag::kSetupError) ok = internal::String(v, &m->error, why, "error");
    if (t == tag::kNic) {
      uint64_t nic = 0;
      ok = internal::Int(v, &nic, why, "nic");
      m->nic = nic != 0;
    }
    if (!ok) return false;
  }
  if (!internal::Done(r, why)) return false;
  if (m->version == 0) return *why = "hello reply without a version", false;
  return true;
}

inline bool Decode(std::string_view payload, ExecRequest* m, std::string* why) {
  TlvReader r(payload);
  uint16_t t;
  std::string_view v;
  uint64_t b = 0;
  while (r.Next(&t, &v)) {
    bool ok = true;
    std::string s;
    switch (t) {
      case tag::kArgv:
      case tag::kEnv:
        if (m->argv.size() + m->env.size() >= kMaxRepeated) return *why = "too many argv/env entries", false;
        ok = internal::String(v, &s, why, t == tag::kArgv ? "argv" : "env");
        (t == tag::kArgv ? m->argv : m->env).push_back(std::move(s));
        break;
      case tag::kShell:
        ok = internal::String(v, &s, why, "shell");
        m->shell = std::move(s);
        break;
      case tag::kCwd: ok = internal::String(v, &m->cwd, why, "cwd"); break;
      case tag::kUser: ok = internal::String(v, &m->user, why, "user"); break;
      case tag::kTimeoutMs: ok = internal::Int(v, &m->timeout_ms, why, "timeout_ms"); break;
      case tag::kKillGraceMs: ok = internal::Int(v, &m->kill_grace_ms, why, "kill_grace_ms"); break;
      case tag::kOutputCap: ok = internal::Int(v, &m->output_cap, why, "output_cap"); break;
      case tag::kStdinFollows:
        ok = internal::Int(v, &b, why, "stdin_follows");
        m->stdin_follows = b != 0;
        break;
      case tag::kPty:
        ok = internal::Int(v, &b, why, "pty");
        m->pty = b != 0;
        break;
      case tag::kRows: ok = internal::Int(v, &m->rows, why, "rows"); break;
      case tag::kCols: ok = internal::Int(v, &m->cols, why, "cols"); break;
      case tag::kControlFd:
        ok = internal::Int(v, &b, why, "control_fd");
        m->control_fd = b != 0;
        break;
      default: break;
    }
    if (!ok) return false;
  }
  if (!internal::Done(r, why)) return false;
  if (m->argv.empty() && !m->shell) return *why = "exec without argv or shell", false;
  if (m->pty && (m->rows < 1 || m->rows > 65535 || m->cols < 1 || m->cols > 65535)) {
    return *why = "pty size out of range", false;
  }
  return true;
}

inline bool Decode(std::string_view payload, ExitResult* m, std::string* why) {
  TlvReader r(payload);
  uint16_t t;
  std::string_view v;
  uint64_t x = 0;
  bool have_code = false;
  while (r.Next(&t, &v)) {
    if (t < tag::kExitCode || t > tag::kDurationNs) continue;
    if (!internal::Int(v, &x, why, "exit field")) return false;
    switch (t) {
      case tag::kExitCode:
        if (x > 255 + 128) return *why = "exit code " + std::to_string(x) + " out of range", false;
        m->exit_code = static_cast<int64_t>(x);
        have_code = true;
        break;
      case tag::kSignal:
        if (x > 64) return *why = "signal " + std::to_string(x) + " out of range", false;
        m->signal = static_cast<uint32_t>(x);
        break;
      case tag::kTimedOut: m->timed_out = x != 0; break;
      case tag::kOomKilled: m->oom_killed = x != 0; break;
      case tag::kStdoutTotal: m->stdout_total = x; break;
      case tag::kStderrTotal: m->stderr_total = x; break;
      case tag::kDurationNs: m->duration_ns = x; break;
      default: break;
    }
  }
  if (!internal::Done(r, why)) return false;
  if (!have_code) return *why = "exit without an exit code", false;
  return true;
}

inline bool Decode(std::string_view payload, ErrorReply* m, std::string* why) {
  TlvReader r(payload);
  uint16_t t;
  std::string_view v;
  while (r.Next(&t, &v)) {
    bool ok = true;
    if (t == tag::kCode) ok = internal::Int(v, &m->code, why, "code");
    if (t == tag::kErrno) ok = internal::Int(v, &m->err, why, "errno");
    if (t == tag::kMessage) ok = internal::String(v, &m->message, why, "message");
    if (!ok) return false;
  }
  if (!internal::Done(r, why)) return false;
  if (m->code == 0 || m->code > 16) return *why = "error code " + std::to_string(m->code) + " out of range", false;
  if (m->err > 4095) return *why = "errno " + std::to_string(m->err) + " out of range", false;
  return true;
}

}  // namespace warren::runtime::microvm::proto

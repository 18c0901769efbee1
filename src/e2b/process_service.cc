// envd's process service (process.proto, package `process`, service
// `Process`) over the node's process table: Start and Connect stream
// ProcessEvents (start, data, end, keepalive) as Connect server streams;
// StreamInput is a client stream of input; List, SendInput, SendSignal,
// CloseStdin and Update (PTY resize) are unary.
// An E2B pid is the number of warren's process id "p<n>".
//
// A Start with `pty` runs the command on a pseudo-terminal of that size
// (ProcessOptions.start.pty): its output is data events `pty` (stdout and
// stderr are the terminal), its input SendInput `pty`. As envd, a PTY's
// input sent as `stdin` (and a plain process's as `pty`), CloseStdin on a
// PTY and a resize of a plain process are errors naming the right call.
// As envd, a stream's client going away stops nothing: the process runs on
// until it ends, its timeout passes or it is killed (commands.connect
// attaches again).
#include <httplib.h>

#include <array>
#include <cstring>
#include <string>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "e2b/connect.h"
#include "e2b/server.h"

namespace warren::e2b {
namespace {

using json = nlohmann::json;

constexpr size_t kChunk = 256 << 10;                         // bytes of output per data event
constexpr size_t kBuffer = 4 << 20;                          // per stream, kept for a slow reader
constexpr auto kReadSlice = std::chrono::milliseconds(200);  // between checks that the client is there

// The user of `Authorization: Basic base64("<user>:")`; "" = the sandbox's.
std::string User(const httplib::Request& req) {
  const std::string auth = req.get_header_value("Authorization");
  if (auth.rfind("Basic ", 0) != 0) return "";
  std::string decoded;
  if (!absl::Base64Unescape(auth.substr(6), &decoded)) return "";
  return decoded.substr(0, decoded.find(':'));
}

std::string WarrenId(uint32_t pid) { return "p" + std::to_string(pid); }

StatusOr<uint32_t> Pid(const json& msg) {
  const json* sel = msg.contains("process") ? &msg["process"] : nullptr;
  if (sel == nullptr || !sel->is_object()) return absl::InvalidArgumentError("process selector is missing");
  if (sel->contains("tag")) return absl::UnimplementedError("selecting a process by tag is not supported");
  if (!sel->contains("pid") || !(*sel)["pid"].is_number_unsigned())
    return absl::InvalidArgumentError("process.pid is missing or not an unsigned integer");
  return (*sel)["pid"].get<uint32_t>();
}

StatusOr<std::shared_ptr<node::ManagedProcess>> FindRunning(E2bState& st, const std::string& id, uint32_t pid) {
  StatusOr<std::shared_ptr<node::ManagedProcess>> mp = st.manager().FindProcess(id, WarrenId(pid));
  if (!mp.ok() || !(*mp)->Info().running)
    return absl::NotFoundError("process with pid " + std::to_string(pid) + " not found");
  return mp;
}

// Go's os.ProcessState.String(), which envd reports as `status`.
std::string GoStatus(const runtime::ExecOutcome& o) {
  if (o.signal != 0) {
    std::string name = strsignal(o.signal);
    if (!name.empty()) name[0] = static_cast<char>(absl::ascii_tolower(static_cast<unsigned char>(name[0])));
    return "signal: " + name;
  }
  return "exit status " + std::to_string(o.exit_code);
}

json Event(json inner) { return json{{"event", std::move(inner)}}; }

// msg.pty (process.PTY {size: {cols, rows}}) into `out`: pty set when
// present; a missing or 0 dimension is the default (24 rows, 80 columns).
Status PtyOptions(const json& msg, runtime::StartOptions* out) {
  if (!msg.contains("pty") || msg["pty"].is_null()) return absl::OkStatus();
  const json& pty = msg["pty"];
  if (!pty.is_object()) return absl::InvalidArgumentError("pty is not an object {size: {cols, rows}}");
  out->pty = true;
  if (!pty.contains("size") || pty["size"].is_null()) return absl::OkStatus();
  if (!pty["size"].is_object()) return absl::InvalidArgumentError("pty.size is not an object {cols, rows}");
  for (const char* key : {"rows", "cols"}) {
    const json& v = pty["size"].contains(key) ? pty["size"][key] : json();
    if (v.is_null()) continue;
    if (!v.is_number_unsigned() || v.get<uint64_t>() > 65535)
      return absl::InvalidArgumentError(std::string("pty.size.") + key + " must be an integer in [0, 65535], got " +
                                        v.dump());
    const auto n = static_cast<uint16_t>(v.get<uint64_t>());
    if (n != 0) (key[0] == 'r' ? out->rows : out->cols) = n;
  }
  return absl::OkStatus();
}

// Streams mp's events from `offsets` on as a Connect server stream: a start
// event, data events (`pty` for a PTY process), then an end event (a
// timed-out command ends the stream with deadline_exceeded instead, output
// lost to a reader more than kBuffer behind with data_loss); a keepalive
// event after `keepalive` without one (0 = never). The process is not
// stopped when the client goes away (envd's processes outlive their stream).
void StreamProcess(httplib::Response& res, std::shared_ptr<node::ManagedProcess> mp, uint32_t pid,
                   std::array<uint64_t, 3> offsets, std::chrono::seconds keepalive) {
  struct Stream {
    std::shared_ptr<node::ManagedProcess> mp;
    uint32_t pid;
    std::array<uint64_t, 3> offsets;
    std::chrono::seconds keepalive;
    bool pty = false;
    bool started = false;
    node::ManagedProcess::Clock::time_point last_event{};
  };
  auto s = std::make_shared<Stream>(Stream{std::move(mp), pid, offsets, keepalive});
  s->pty = s->mp->Info().pty;
  res.set_chunked_content_provider("application/connect+json", [s](size_t, httplib::DataSink& sink) {
    auto write = [&sink, &s](const std::string& bytes) {
      s->last_event = node::ManagedProcess::Clock::now();
      return sink.write(bytes.data(), bytes.size());
    };
    if (!s->started) {
      s->started = true;
      return write(Envelope(Event({{"start", {{"pid", s->pid}}}})));
    }
    if (s->keepalive.count() > 0 && node::ManagedProcess::Clock::now() - s->last_event >= s->keepalive) {
      if (!write(Envelope(Event({{"keepalive", json::object()}})))) return false;
    }
    node::ManagedProcess::ReadResult r =
        s->mp->Read(s->offsets, kChunk, node::ManagedProcess::Clock::now() + kReadSlice);
    for (node::OutputData& d : r.chunks) {
      const int i = static_cast<int>(d.stream);
      s->offsets[i] = d.offset + d.data.size();
      if (d.stream == node::ProcStream::kControl) continue;
      if (d.dropped != 0) {  // the reader fell more than kBuffer behind: say so, never pass a gap off as output
        (void)write(
            EndStream(absl::DataLossError(std::to_string(d.dropped) + " bytes of the command's output were "
                                                                      "dropped while the client read too slowly")));
        sink.done();
        return true;
      }
      const char* key = s->pty ? "pty" : d.stream == node::ProcStream::kStdout ? "stdout" : "stderr";
      if (!write(Envelope(Event({{"data", {{key, absl::Base64Escape(d.data)}}}})))) return false;
    }
    if (!r.chunks.empty() || !r.finished) return sink.is_writable();
    const runtime::ExecOutcome o = s->mp->Info().outcome;
    if (o.timed_out) {
      if (!write(EndStream(absl::DeadlineExceededError("the command's timeout passed; it was killed")))) return false;
    } else {
      const bool exited = o.signal == 0;
      json end = {{"exitCode", exited ? o.exit_code : -1}, {"exited", exited}, {"status", GoStatus(o)}};
      // envd's `error` is Go's cmd.Wait() error: the same text, set unless
      // the process exited 0.
      if (!exited || o.exit_code != 0) end["error"] = end["status"];
      if (!write(Envelope(Event({{"end", end}})))) return false;
      if (!write(EndStream(absl::OkStatus()))) return false;
    }
    sink.done();
    return true;
  });
}

void StreamError(httplib::Response& res, const Status& s) {
  res.status = 200;
  res.set_content(EndStream(s), "application/connect+json");
}

void Start(E2bState& st, const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
  StatusOr<std::string> body = ReadBody(reader, res, st.options().max_body_bytes);
  if (!body.ok()) return StreamError(res, body.status());
  StatusOr<std::string> id = Addressed(st, req);
  if (!id.ok()) return StreamError(res, id.status());
  StatusOr<json> msg = FirstMessage(*body);
  if (!msg.ok()) return StreamError(res, msg.status());
  const json& cfg = (*msg)["process"];
  if (!cfg.is_object() || !cfg.contains("cmd") || !cfg["cmd"].is_string() || cfg["cmd"].get<std::string>().empty())
    return StreamError(res, absl::InvalidArgumentError("process.cmd is missing"));
  node::ProcessOptions opts;
  if (Status p = PtyOptions(*msg, &opts.start); !p.ok()) return StreamError(res, p);
  StatusOr<std::chrono::seconds> keepalive = KeepaliveInterval(req);
  if (!keepalive.ok()) return StreamError(res, keepalive.status());
  runtime::ExecSpec spec;
  spec.argv.push_back(cfg["cmd"].get<std::string>());
  if (cfg.contains("args")) {
    for (const json& a : cfg["args"]) {
      if (!a.is_string()) return StreamError(res, absl::InvalidArgumentError("process.args holds a non-string"));
      spec.argv.push_back(a.get<std::string>());
    }
  }
  if (cfg.contains("envs") && cfg["envs"].is_object()) {
    for (const auto& [k, v] : cfg["envs"].items()) {
      if (!v.is_string())
        return StreamError(res, absl::InvalidArgumentError("process.envs[" + k + "] is not a string"));
      spec.env[k] = v.get<std::string>();
    }
  }
  if (cfg.contains("cwd") && cfg["cwd"].is_string()) spec.cwd = cfg["cwd"].get<std::string>();
  spec.user = User(req);
  int64_t timeout_ms = 0;
  if (req.has_header("Connect-Timeout-Ms") &&
      !absl::SimpleAtoi(req.get_header_value("Connect-Timeout-Ms"), &timeout_ms))
    return StreamError(res, absl::InvalidArgumentError("Connect-Timeout-Ms is not an integer"));
  // The command's `timeout` (the call's Connect deadline) bounds the command
  // itself: warren kills its tree when it passes, as envd ends it with the
  // stream; 0 or absent = none.
  opts.buffer_bytes = kBuffer;
  opts.timeout = spec.timeout = std::chrono::milliseconds(std::max<int64_t>(timeout_ms, 0));
  StatusOr<std::shared_ptr<node::ManagedProcess>> mp = st.manager().Spawn(*id, spec, opts);
  if (!mp.ok()) return StreamError(res, mp.status());
  // A PTY's input is the terminal's: never closed here.
  const bool keep_stdin =
      opts.start.pty || (msg->contains("stdin") && (*msg)["stdin"].is_boolean() && (*msg)["stdin"].get<bool>());
  if (!keep_stdin) (void)(*mp)->Write("", true);
  uint32_t pid = 0;
  if (!absl::SimpleAtoi((*mp)->id().substr(1), &pid))
    return StreamError(res, absl::InternalError("process id \"" + (*mp)->id() + "\" is not p<n>"));
  StreamProcess(res, *std::move(mp), pid, {0, 0, 0}, *keepalive);
}

void Connect(E2bState& st, const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
  StatusOr<std::string> body = ReadBody(reader, res, st.options().max_body_bytes);
  if (!body.ok()) return StreamError(res, body.status());
  StatusOr<std::string> id = Addressed(st, req);
  if (!id.ok()) return StreamError(res, id.status());
  StatusOr<json> msg = FirstMessage(*body);
  if (!msg.ok()) return StreamError(res, msg.status());
  StatusOr<uint32_t> pid = Pid(*msg);
  if (!pid.ok()) return StreamError(res, pid.status());
  StatusOr<std::chrono::seconds> keepalive = KeepaliveInterval(req);
  if (!keepalive.ok()) return StreamError(res, keepalive.status());
  StatusOr<std::shared_ptr<node::ManagedProcess>> mp = FindRunning(st, *id, *pid);
  if (!mp.ok()) return StreamError(res, mp.status());
  const node::ProcessStatus info = (*mp)->Info();
  StreamProcess(res, *std::move(mp), *pid, {info.totals[0], info.totals[1], 0}, *keepalive);
}

StatusOr<json> List(E2bState& st, const std::string& id, const json&) {
  ASSIGN_OR_RETURN(std::vector<node::ProcessStatus> all, st.manager().Processes(id));
  json procs = json::array();
  for (const node::ProcessStatus& p : all) {
    uint32_t pid = 0;
    if (!p.running || !absl::SimpleAtoi(p.process_id.substr(1), &pid)) continue;
    json cfg = {{"cmd", p.argv.empty() ? "/bin/sh" : p.argv[0]}, {"args", json::array()}, {"envs", json::object()}};
    for (size_t i = 1; i < p.argv.size(); ++i) cfg["args"].push_back(p.argv[i]);
    if (p.shell) cfg["args"] = json::array({"-c", *p.shell});
    procs.push_back({{"config", cfg}, {"pid", pid}});
  }
  return json{{"processes", procs}};
}

StatusOr<json> SendSignal(E2bState& st, const std::string& id, const json& msg) {
  ASSIGN_OR_RETURN(uint32_t pid, Pid(msg));
  const json sig = msg.contains("signal") ? msg["signal"] : json();
  int n = 0;
  if (sig == "SIGNAL_SIGKILL" || sig == 9) {
    n = SIGKILL;
  } else if (sig == "SIGNAL_SIGTERM" || sig == 15) {
    n = SIGTERM;
  } else {
    return absl::InvalidArgumentError("signal " + sig.dump() + " is not SIGNAL_SIGKILL or SIGNAL_SIGTERM");
  }
  ASSIGN_OR_RETURN(std::shared_ptr<node::ManagedProcess> mp, FindRunning(st, id, pid));
  RETURN_IF_ERROR(mp->Signal(n, /*whole_tree=*/true));
  return json::object();
}

// A ProcessInput {stdin: base64} or {pty: base64} (a oneof), decoded.
struct Input {
  bool pty = false;
  std::string data;
};

StatusOr<Input> ParseInput(const json& msg) {
  if (!msg.contains("input") || !msg["input"].is_object()) return absl::InvalidArgumentError("input is missing");
  const json& in = msg["input"];
  Input out;
  out.pty = in.contains("pty");
  if (out.pty && in.contains("stdin")) return absl::InvalidArgumentError("input holds both stdin and pty (a oneof)");
  if (!out.pty && !in.contains("stdin")) return absl::UnimplementedError("input is neither stdin nor pty");
  const char* key = out.pty ? "pty" : "stdin";
  if (!in[key].is_string() || !absl::Base64Unescape(in[key].get<std::string>(), &out.data))
    return absl::InvalidArgumentError(std::string("input.") + key + " is not base64");
  return out;
}

// Writes `in` to process `pid`. As envd: input for the other kind of
// process is an `internal` error naming the right one.
Status WriteInput(node::ManagedProcess& mp, uint32_t pid, Input in) {
  const bool is_pty = mp.Info().pty;
  if (in.pty && !is_pty)
    return absl::InternalError("error writing to tty: tty not assigned to process " + std::to_string(pid) +
                               " - input should be written to the stdin, not the tty");
  if (!in.pty && is_pty)
    return absl::InternalError("error writing to stdin: tty assigned to process " + std::to_string(pid) +
                               " - input should be written to the pty, not the stdin");
  return mp.Write(std::move(in.data), false);
}

StatusOr<json> SendInput(E2bState& st, const std::string& id, const json& msg) {
  ASSIGN_OR_RETURN(uint32_t pid, Pid(msg));
  ASSIGN_OR_RETURN(Input in, ParseInput(msg));
  ASSIGN_OR_RETURN(std::shared_ptr<node::ManagedProcess> mp, FindRunning(st, id, pid));
  RETURN_IF_ERROR(WriteInput(*mp, pid, std::move(in)));
  return json::object();
}

// StreamInput, envd's client stream (commands.stream_input, the async SDK's
// input handles): StreamInputRequest messages as the client sends them,
// `start` {process} before any input, then `data` {input} and `keepalive`
// {} in any order and number (a later `start` moves the stream to another
// process, as envd). Each input is written to the process as its message
// arrives, so in order and before the stream ends; the answer (an empty
// StreamInputResponse) comes when the client ends its stream. An error
// (no such process, input of the wrong kind, a malformed message, more than
// the body limit in all) is answered at once, as envd does, and the rest of
// the stream is not read: the connection closes.
void StreamInput(E2bState& st, const httplib::Request& req, httplib::Response& res,
                 const httplib::ContentReader& reader) {
  auto fail = [&res](const Status& s) {
    res.set_header("Connection", "close");
    StreamError(res, s);
  };
  StatusOr<std::string> id = Addressed(st, req);
  if (!id.ok()) return fail(id.status());
  const uint64_t limit = st.options().max_body_bytes;
  std::shared_ptr<node::ManagedProcess> mp;
  uint32_t pid = 0;
  MessageReader messages([&](json msg) -> Status {
    if (msg.contains("start")) {  // as envd: a later start moves the stream to that process
      ASSIGN_OR_RETURN(pid, Pid(msg["start"]));
      ASSIGN_OR_RETURN(mp, FindRunning(st, *id, pid));
      return absl::OkStatus();
    }
    if (msg.contains("keepalive")) return absl::OkStatus();
    if (!msg.contains("data") || !msg["data"].is_object())
      return absl::UnimplementedError("an input stream message is none of start, data, keepalive");
    if (mp == nullptr) return absl::InvalidArgumentError("the input stream's first message must be start {process}");
    ASSIGN_OR_RETURN(Input in, ParseInput(msg["data"]));
    return WriteInput(*mp, pid, std::move(in));
  });
  uint64_t received = 0;
  Status failed;
  const bool read = reader([&](const char* data, size_t n) {
    received += n;
    if (received > limit) {
      failed = absl::ResourceExhaustedError(BodyLimitMessage(limit));
      return false;
    }
    failed = messages.Feed(std::string_view(data, n));
    return failed.ok();
  });
  if (failed.ok() && res.status == 413) failed = absl::ResourceExhaustedError(BodyLimitMessage(limit));
  if (failed.ok() && !read)
    failed = absl::InvalidArgumentError("the input stream could not be read (malformed or cut)");
  if (failed.ok()) failed = messages.Finish();
  if (!failed.ok()) return fail(failed);
  res.status = 200;
  res.set_content(Envelope(json::object()) + EndStream(absl::OkStatus()), "application/connect+json");
}

StatusOr<json> CloseStdin(E2bState& st, const std::string& id, const json& msg) {
  ASSIGN_OR_RETURN(uint32_t pid, Pid(msg));
  ASSIGN_OR_RETURN(std::shared_ptr<node::ManagedProcess> mp, FindRunning(st, id, pid));
  if (mp->Info().pty)  // envd's CodeUnknown
    return absl::UnknownError("error closing stdin: cannot close stdin for PTY process " + std::to_string(pid) +
                              " - send Ctrl+D (0x04) instead");
  RETURN_IF_ERROR(mp->Write("", true));
  return json::object();
}

// UpdateRequest {process, pty: {size: {cols, rows}}}: resizes the PTY.
StatusOr<json> Update(E2bState& st, const std::string& id, const json& msg) {
  ASSIGN_OR_RETURN(uint32_t pid, Pid(msg));
  runtime::StartOptions size;
  RETURN_IF_ERROR(PtyOptions(msg, &size));
  ASSIGN_OR_RETURN(std::shared_ptr<node::ManagedProcess> mp, FindRunning(st, id, pid));
  if (!size.pty) return json::object();  // nothing to update (as envd)
  if (!mp->Info().pty)
    return absl::InternalError("error resizing tty: tty not assigned to process " + std::to_string(pid));
  RETURN_IF_ERROR(mp->Resize(size.rows, size.cols));
  return json::object();
}

}  // namespace

void AddProcessRoutes(httplib::Server& server, const std::shared_ptr<E2bState>& state) {
  // Streaming calls: their one request message comes chunked (StreamsBody).
  server.Post("/process.Process/Start",
              [state](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
                Start(*state, req, res, reader);
              });
  server.Post("/process.Process/Connect",
              [state](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
                Connect(*state, req, res, reader);
              });
  auto unary = [state](StatusOr<json> (*f)(E2bState&, const std::string&, const json&)) {
    return [state, f](const httplib::Request& req, httplib::Response& res) { ConnectUnary(*state, req, res, f); };
  };
  server.Post("/process.Process/StreamInput",
              [state](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader& reader) {
                StreamInput(*state, req, res, reader);
              });
  server.Post("/process.Process/List", unary(List));
  server.Post("/process.Process/SendSignal", unary(SendSignal));
  server.Post("/process.Process/SendInput", unary(SendInput));
  server.Post("/process.Process/CloseStdin", unary(CloseStdin));
  server.Post("/process.Process/Update", unary(Update));
}

}  // namespace warren::e2b

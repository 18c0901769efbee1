// One fncall call on a pooled worker: the call's message and pipes, the
// output pump with its time-outs, the result from D's status records.
// FnCallRunner::Exec (exec through the pool).
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <system_error>

#include <absl/strings/escaping.h>

#include "common/output_pump.h"
#include "runtime/fncall/fncall_internal.h"

namespace warren::runtime::fncall::internal {
namespace {

class BlobBuilder {
 public:
  json Add(const std::string& b) {
    json ref = json::array({data_.size(), b.size()});
    data_ += b;
    return ref;
  }
  std::string& data() { return data_; }

 private:
  std::string data_;
};

// One of a call's output pipes, read by warrend.
using Stream = PumpStream;  // fd, data (at most cap), total, cap

// An outcome from a wait status (nullopt: killed at the time-out, or lost).
ExecOutcome MakeOutcome(std::optional<int> wstatus, bool timed_out, Stream* out, Stream* err,
                        std::chrono::nanoseconds duration) {
  ExecOutcome r;
  if (!wstatus) {
    r.signal = SIGKILL;
    r.exit_code = 128 + SIGKILL;
  } else if (WIFSIGNALED(*wstatus)) {
    r.signal = WTERMSIG(*wstatus);
    r.exit_code = 128 + r.signal;
  } else {
    r.exit_code = WEXITSTATUS(*wstatus);
  }
  r.timed_out = timed_out;
  r.stdout_total = out->total;
  r.stderr_total = err->total;
  r.stdout_truncated = out->total > out->data.size();
  r.stderr_truncated = err->total > err->data.size();
  r.stdout_data = std::move(out->data);
  r.stderr_data = std::move(err->data);
  r.duration = duration;
  return r;
}

}  // namespace

StatusOr<FnCallResult> FnCallPoolImpl::Call(const std::vector<std::string>& lower_dirs, const FnCallRequest& req) {
  const auto t0 = Clock::now();
  if (lower_dirs.empty()) return absl::InvalidArgumentError("fncall needs at least one layer");
  if (std::find(std::begin(kFnCallLanguages), std::end(kFnCallLanguages), req.language) == std::end(kFnCallLanguages)) {
    return absl::InvalidArgumentError("fncall: unsupported language '" + req.language +
                                      "' (python, bash, cpp, c, java, go, rust, nodejs)");
  }
  for (const auto& [k, v] : req.env) {
    if (k.empty() || k.find('=') != std::string::npos || k.find('\0') != std::string::npos)
      return absl::InvalidArgumentError("fncall: bad env key '" + k + "'");
  }
  PoolKey key{lower_dirs};
  ASSIGN_OR_RETURN(std::unique_ptr<Worker> w, Acquire(key));

  const uint64_t cap = std::clamp<uint64_t>(req.output_cap_bytes ? req.output_cap_bytes : 16u << 20, 1, 256u << 20);
  const uint32_t mem_mb = req.memory_mb ? req.memory_mb : opt_.default_memory_mb;
  FnCallResult res;
  auto fail = [&](const Status& s) -> StatusOr<FnCallResult> {
    Release(key, std::move(w), false);
    res.sandbox_error = "worker lost: " + s.ToString();
    res.duration = Clock::now() - t0;
    return res;
  };
  const uint64_t mem = uint64_t{mem_mb} << 20;
  if (mem != w->memory_bytes) {
    jail::CgroupLimits lim;
    lim.cpu_millis = opt_.cpu_millis;
    lim.memory_bytes = mem;
    lim.pids = opt_.pids;
    if (mem > w->memory_bytes) {
      // v1 refuses memory.limit_in_bytes above memory.memsw.limit_in_bytes:
      // raise memsw first (SetLimits writes memory, then memsw).
      for (const std::string& dir : w->cgroup->dirs()) {
        const std::string f = dir + "/memory.memsw.limit_in_bytes";
        if (::access(f.c_str(), F_OK) == 0) (void)WriteString(f, std::to_string(mem));
      }
    }
    if (Status s = w->cgroup->SetLimits(lim); !s.ok()) return fail(s);
    w->memory_bytes = mem;
  }
  auto oom_kills = [&w]() -> uint64_t {
    if (w->oom_fd.valid()) {
      if (auto v = ReadOomKills(w->oom_fd.get())) return *v;
    }
    return w->cgroup->OomKillCount();
  };
  const uint64_t oom_before = oom_kills();

  // The pre-forked call process D (cloned right after the previous call).
  if (!w->call_pidfd.valid()) {
    std::string m;
    UniqueFd pidfd;
    if (Status s = RecvMsgUntil(w->chan.get(), 256, &m, &pidfd, Clock::now() + milliseconds(20000)); !s.ok())
      return fail(s);
    auto z = ParseZygoteMsg(m);
    if (!z.ok()) return fail(z.status());
    if (z->kind != 'S' || !pidfd.valid()) return fail(absl::InternalError("worker: expected a spawned message"));
    w->call_pidfd = std::move(pidfd);
    w->call_serial = z->serial;
  }
  const bool compiled =
      std::find(std::begin(kFnCallCompiled), std::end(kFnCallCompiled), req.language) != std::end(kFnCallCompiled);

  // The call's pipes: warrend keeps the read ends (the write end of stdin)
  // and hands the others to D with the call.
  Stream out, err, cout, cerr, st;
  out.cap = err.cap = cout.cap = cerr.cap = cap;
  st.cap = uint64_t{1} << 30;  // status records and fetched files (each at most cap, base64)
  UniqueFd in_r, in_w, out_w, err_w, st_w, cout_w, cerr_w;
  auto make_pipe = [](UniqueFd* r, UniqueFd* wr) -> Status {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) return Errno("pipe2(fncall call)");
    r->reset(p[0]);
    wr->reset(p[1]);
    return absl::OkStatus();
  };
  for (auto [r, wr] :
       {std::pair{&in_r, &in_w}, std::pair{&out.fd, &out_w}, std::pair{&err.fd, &err_w}, std::pair{&st.fd, &st_w}}) {
    if (Status s = make_pipe(r, wr); !s.ok()) return fail(s);
  }
  if (compiled) {
    if (Status s = make_pipe(&cout.fd, &cout_w); !s.ok()) return fail(s);
    if (Status s = make_pipe(&cerr.fd, &cerr_w); !s.ok()) return fail(s);
  }

  ++w->seq;
  std::string j;
  BlobBuilder blobs;
  CallHead head{kCallMagic, 0, compiled ? 6u : 4u, 0, 0};
  if (req.language == "python" && req.env.empty() && req.files.empty() && req.fetch_files.empty()) {
    head.flags |= kCallPlainPython;  // D runs it without parsing anything
    blobs.data() = req.code;
  } else {
    json env = DefaultCallEnv();
    for (const auto& [k, v] : req.env) env[k] = v;
    json files = json::array();
    for (const auto& [path, data] : req.files) {
      json ref = blobs.Add(data);
      files.push_back(json::array({path, ref[0], ref[1]}));
    }
    json hdr = {{"lang", req.language}, {"compile_timeout_ms", req.compile_timeout.count()},
                {"cap", cap},           {"env", env},
                {"files", files},       {"fetch", req.fetch_files}};
    hdr["code"] = blobs.Add(req.code);
    j = hdr.dump(-1, ' ', false, json::error_handler_t::replace);
  }
  const std::string& blob = blobs.data();
  if (j.size() + blob.size() > (uint64_t{1} << 31)) return fail(absl::InvalidArgumentError("fncall: call too large"));
  head.json_len = static_cast<uint32_t>(j.size());
  head.blob_len = static_cast<uint32_t>(blob.size());
  std::vector<int> fds = {in_r.get(), out_w.get(), err_w.get(), st_w.get()};
  if (compiled) {
    fds.push_back(cout_w.get());
    fds.push_back(cerr_w.get());
  }
  std::string msg;
  UniqueFd memfd;
  if (j.size() + blob.size() > kInlineMax) {
    head.flags |= kCallInMemfd;
    memfd.reset(::memfd_create("warren-fncall-call", MFD_CLOEXEC));
    if (!memfd.valid()) return fail(Errno("memfd_create(warren-fncall-call)"));
    for (const std::string* part : {static_cast<const std::string*>(&j), &blob}) {
      for (size_t off = 0, i = 0; off < part->size() && i < (1u << 20); ++i) {
        ssize_t n = ::write(memfd.get(), part->data() + off, part->size() - off);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return fail(Errno("write(warren-fncall-call memfd)"));
        off += static_cast<size_t>(n);
      }
    }
    fds.push_back(memfd.get());
    msg.assign(reinterpret_cast<const char*>(&head), sizeof head);
  } else {
    msg.reserve(sizeof head + j.size() + blob.size());
    msg.assign(reinterpret_cast<const char*>(&head), sizeof head);
    msg += j;
    msg += blob;
  }
  const auto t_send = Clock::now();
  // Past this the worker stopped answering (the stage time-outs are ours).
  const auto hard = t_send + req.run_timeout + req.compile_timeout + milliseconds(30000);
  if (Status s = SendMsgUntil(w->chan.get(), msg, fds, hard); !s.ok()) return fail(s);
  for (UniqueFd* f : {&in_r, &out_w, &err_w, &st_w, &cout_w, &cerr_w, &memfd}) f->reset();

  // Feed stdin, collect output, enforce the time-outs, until D has ended
  // (the zygote's 'X') and every pipe is at EOF (D's pid namespace is gone:
  // nobody else holds the write ends).
  // Compiled languages: D enforces compile_timeout itself; the run's clock
  // starts at its first status record (the compile stage's).
  constexpr Clock::time_point kNever = Clock::time_point::max();
  Clock::time_point deadline = kNever;  // of the current stage
  if (compiled) {
    deadline = t_send + req.compile_timeout + milliseconds(5000);
  } else if (req.run_timeout.count() > 0) {
    deadline = t_send + req.run_timeout;
  }
  bool run_clock_started = !compiled;
  Clock::time_point compile_end = t_send;  // compiled languages: the compile stage's record came
  st.on_data = [&](std::string_view data) {
    if (run_clock_started) return;
    run_clock_started = true;
    compile_end = Clock::now();
    // The record's own time of the compile stage's end (zygote.py: t_ns, the
    // same CLOCK_MONOTONIC), so that a loaded daemon reading it late does not
    // take that delay off the run's time; kept within [t_send, now].
    constexpr std::string_view kT = "\"t_ns\": ";
    if (size_t at = data.find(kT); at != std::string_view::npos) {
      int64_t ns = 0;
      const char* p = data.data() + at + kT.size();
      const char* end = data.data() + data.size();
      if (std::from_chars(p, end, ns).ec == std::errc()) {
        const Clock::time_point t{std::chrono::duration_cast<Clock::duration>(std::chrono::nanoseconds(ns))};
        if (t >= t_send && t <= compile_end) compile_end = t;
      }
    }
    deadline = req.run_timeout.count() > 0 ? compile_end + req.run_timeout : kNever;
  };
  std::optional<ZygoteMsg> exited;
  Status exit_error;
  PumpOptions po;
  po.exit_fd = w->chan.get();  // readable: D ended (or its set-up failed)
  po.on_exit_readable = [&]() -> StatusOr<bool> {
    std::string m;
    exit_error = RecvMsgUntil(w->chan.get(), 256, &m, nullptr, Clock::now() + milliseconds(5000));
    if (!exit_error.ok()) return exit_error;
    auto z = ParseZygoteMsg(m);
    if (!z.ok()) return exit_error = z.status();
    if (z->kind != 'X' || z->serial != w->call_serial)
      return exit_error = absl::InternalError("worker: expected the call process's exit");
    exited = *z;
    return true;
  };
  po.stdin_fd = &in_w;
  po.stdin_data = req.stdin_data;
  po.deadline = [&] { return deadline; };
  // PID 1 of the call's pid namespace: every process of the call dies.
  po.kill = [&](int) { (void)::syscall(SYS_pidfd_send_signal, w->call_pidfd.get(), SIGKILL, nullptr, 0); };
  po.kill_grace = milliseconds(0);
  // Until every pipe is at EOF (D's pid namespace is gone: nobody else holds
  // the write ends).
  po.after_exit = PumpOptions::AfterExit::kUntilEof;
  po.linger = milliseconds(5000);
  po.cancelled = [&] { return Clock::now() >= hard; };
  po.what = "fncall call";
  StatusOr<PumpResult> pumped = PumpOutput(po, {&out, &err, &cout, &cerr, &st});
  if (!pumped.ok()) {
    if (!exit_error.ok()) return fail(exit_error);
    if (pumped.status().code() == absl::StatusCode::kCancelled)
      return fail(absl::DeadlineExceededError("fncall call process did not end"));
    if (pumped.status().code() == absl::StatusCode::kDeadlineExceeded)
      return fail(absl::InternalError("fncall: the call's pipes stayed open after it ended"));
    return fail(pumped.status());
  }
  const bool timed_out = pumped->timed_out;
  const auto run_ns = Clock::now() - t_send;
  w->call_pidfd.reset();  // the next call process announces itself with its own 'S'
  // D's wait status, from the zygote's waitid (si_code, si_status).
  int wstatus = 0;
  if (exited->a == CLD_EXITED) {
    wstatus = (exited->b & 0xff) << 8;
  } else if (exited->a == CLD_KILLED || exited->a == CLD_DUMPED) {
    wstatus = (exited->b & 0x7f) | (exited->a == CLD_DUMPED ? 0x80 : 0);
  } else {
    return fail(ErrnoToStatus(exited->b, "fncall zygote: waitid(call process)"));
  }

  // D's status records: u32 length + json each.
  std::map<std::string, json> stage;
  for (size_t off = 0; off + 4 <= st.data.size();) {
    uint32_t len;
    memcpy(&len, st.data.data() + off, sizeof len);
    if (len > st.data.size() - off - 4) break;
    json rec = json::parse(st.data.substr(off + 4, len), nullptr, false);
    off += 4 + len;
    if (!rec.is_object() || !rec.contains("stage") || !rec["stage"].is_string()) continue;
    const std::string kind = rec["stage"].get<std::string>();
    if (kind == "file") {
      const std::string path = rec.value("path", "");
      std::string data;
      if (rec.value("missing", false) || !absl::Base64Unescape(rec.value("b64", ""), &data)) {
        res.missing_files.push_back(path);
      } else {
        res.files[path] = std::move(data);
      }
    } else {
      stage[kind] = std::move(rec);
    }
  }
  auto int_of = [](const json& rec, const char* k) -> int {
    auto it = rec.find(k);
    return it != rec.end() && it->is_number_integer() ? it->get<int>() : 0;
  };
  if (stage.count("setup")) res.sandbox_error = stage["setup"].value("error", "call set-up failed");
  bool run_stage = !stage.count("setup");
  if (compiled && (stage.count("compile") || timed_out)) {
    std::optional<int> cstatus;
    bool ctimed_out = true;
    if (stage.count("compile")) {
      cstatus = int_of(stage["compile"], "status");
      ctimed_out = stage["compile"].value("timed_out", false);
    }
    // Each stage's own time: compile until its record, the run after it.
    res.compile = MakeOutcome(cstatus, ctimed_out, &cout, &cerr, run_clock_started ? compile_end - t_send : run_ns);
    if (!cstatus || ctimed_out || *cstatus != 0) run_stage = false;
  }
  if (run_stage) {
    std::optional<int> status;
    if (stage.count("run")) {
      status = int_of(stage["run"], "status");
    } else if (req.language == "python" && !timed_out) {
      status = wstatus;  // the code ran as PID 1 itself
      // A signal emulated by the call (zygote.py, DEATH_SIGNALS): D exited
      // 128 + sig after reporting it; report it as killed by that signal.
      if (stage.count("signal")) {
        const int sig = int_of(stage["signal"], "sig");
        if (WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 128 + sig && sig > 0 && sig < 64) status = sig;
      }
    }
    res.run = MakeOutcome(status, timed_out, &out, &err, compiled ? run_ns - (compile_end - t_send) : run_ns);
  }
  const uint64_t oom_after = oom_kills();
  if (oom_after > oom_before) {
    ExecOutcome* o = res.run ? &*res.run : (res.compile ? &*res.compile : nullptr);
    if (o) o->oom_killed = true;
  }
  // Safety net: the run stage's processes died with its pid namespace, a
  // compile stage's with its process group. After an abnormal end (or a
  // compile stage) check that only the zygote and at most one child of it
  // (the next call's pre-forked process; call processes are never the
  // zygote's children: they are D's) are left in the worker cgroup;
  // otherwise the worker is not reused.
  bool healthy = true;
  const bool abnormal = !res.sandbox_error.empty() || res.compile.has_value() ||
                        (res.run && (res.run->timed_out || res.run->oom_killed || res.run->signal != 0));
  if (abnormal && healthy) {
    healthy = false;
    for (int i = 0; i < 400 && !healthy; ++i) {  // a call process may still be exiting
      if (i > 0) ::usleep(500);
      healthy = OnlyZygoteAndOneChild(w->cgroup->Pids(true), w->pid);
    }
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    ++stats_.calls;
  }
  Release(key, std::move(w), healthy);
  res.duration = Clock::now() - t0;
  return res;
}

}  // namespace warren::runtime::fncall::internal

namespace warren::runtime {

namespace {
std::string ShellQuote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}
}  // namespace

StatusOr<ExecOutcome> FnCallRunner::Exec(const ExecSpec& spec) {
  if (!spec.user.empty() && spec.user != "root")
    return absl::InvalidArgumentError("fncall: calls run as root of their worker; user '" + spec.user +
                                      "' is not supported");
  if (!spec.cwd.empty() && spec.cwd != "/tmp" && spec.cwd.rfind("/tmp/", 0) != 0)
    return absl::InvalidArgumentError("fncall: cwd must be under /tmp (the scratch dir), got '" + spec.cwd + "'");
  FnCallRequest req;
  req.language = "bash";
  std::string script;
  if (!spec.cwd.empty())
    script += "mkdir -p " + ShellQuote(spec.cwd) + " && cd " + ShellQuote(spec.cwd) + " || exit 125\n";
  if (spec.shell) {
    script += *spec.shell;
  } else {
    if (spec.argv.empty()) return absl::InvalidArgumentError("fncall: exec needs argv or shell");
    script += "exec";
    for (const auto& a : spec.argv) {
      if (a.find('\0') != std::string::npos) return absl::InvalidArgumentError("fncall: NUL byte in argv");
      script += " " + ShellQuote(a);
    }
  }
  req.code = std::move(script);
  req.stdin_data = spec.stdin_data;
  req.env = spec.env;
  req.run_timeout = spec.timeout;
  req.memory_mb = memory_mb_;
  req.output_cap_bytes = spec.output_cap_bytes;
  ASSIGN_OR_RETURN(FnCallResult r, pool_->Call(lower_dirs_, req));
  if (!r.sandbox_error.empty()) return absl::InternalError("fncall: " + r.sandbox_error);
  if (!r.run) return absl::InternalError("fncall: the call produced no run outcome");
  return std::move(*r.run);
}

}  // namespace warren::runtime

// Real-kernel tests of the fncall pool: workers are jailed python zygotes over
// a read-only root (the debian-12 base rootfs dir, WARREN_BASE_ROOTFS), so
// these need root, user namespaces and cgroups; they skip with a reason when
// the base rootfs is absent.
#include "runtime/fncall/fncall.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include <dirent.h>

#include "common/status.h"
#include "jail/cgroup.h"
#include "status_matchers.h"

namespace warren::runtime {
namespace {

// ctest runs test cases in parallel processes: each process gets its own
// cgroup parent, so counting one case's workers never sees another's.
std::string CgroupName() { return "warren-fncall-test-" + std::to_string(::getpid()); }

using std::chrono::milliseconds;

std::string BaseRootfs() {
  const char* e = ::getenv("WARREN_BASE_ROOTFS");
  return e ? e : "/var/cache/warren/rootfs/debian-12";
}

// A call's compile or run outcome, or an error naming its sandbox error when
// that stage did not happen (the assertions below then stop with it).
StatusOr<ExecOutcome> Outcome(const std::optional<ExecOutcome>& stage, const std::string& sandbox_error) {
  if (!stage.has_value()) return absl::NotFoundError("no outcome (sandbox error: \"" + sandbox_error + "\")");
  return *stage;
}

class FnCallTest : public ::testing::Test {
 protected:
  void SetUp() override {
    struct stat st;
    if (::stat((BaseRootfs() + "/usr/bin/python3").c_str(), &st) != 0)
      GTEST_SKIP() << "no base rootfs with python3 at " << BaseRootfs() << " (set WARREN_BASE_ROOTFS)";
    char tmpl[] = "/tmp/fncall-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    FnCallOptions o;
    o.mount_point = dir_ + "/root";
    o.max_workers = ::getenv("FNCALL_TEST_WORKERS") ? atoi(::getenv("FNCALL_TEST_WORKERS")) : 2;
    o.cgroup_name = CgroupName();
    auto p = NewFnCallPool(o);
    ASSERT_OK(p);
    pool_ = std::move(*p);
  }
  void TearDown() override {
    pool_.reset();
    // The pool leaves its (now empty) parent cgroup for the next pool; this
    // test's parent is private to the process, so remove it in every hierarchy.
    if (FILE* f = ::fopen("/proc/self/cgroup", "r")) {
      char line[512];
      while (::fgets(line, sizeof line, f)) {
        std::string l(line);
        if (!l.empty() && l.back() == '\n') l.pop_back();
        size_t a = l.find(':'), b = l.find(':', a + 1);
        if (a == std::string::npos || b == std::string::npos) continue;
        std::string ctrl = l.substr(a + 1, b - a - 1), path = l.substr(b + 1);
        if (ctrl.rfind("name=", 0) == 0) continue;
        std::string first = ctrl.empty() ? "unified" : ctrl.substr(0, ctrl.find(','));
        ::rmdir(("/sys/fs/cgroup/" + first + (path == "/" ? "" : path) + "/" + CgroupName()).c_str());
      }
      ::fclose(f);
    }
    if (!dir_.empty()) {
      ::rmdir((dir_ + "/root").c_str());
      ::rmdir(dir_.c_str());
    }
  }
  StatusOr<FnCallResult> Call(const std::string& lang, const std::string& code,
                              milliseconds timeout = milliseconds(10000), uint32_t memory_mb = 256,
                              const std::string& in = "") {
    FnCallRequest r;
    r.language = lang;
    r.code = code;
    r.run_timeout = timeout;
    r.memory_mb = memory_mb;
    r.stdin_data = in;
    return pool_->Call({BaseRootfs()}, r);
  }
  // The run's outcome of Call(...); an error when the call failed or did not run.
  StatusOr<ExecOutcome> Run(const std::string& lang, const std::string& code,
                            milliseconds timeout = milliseconds(10000), uint32_t memory_mb = 256,
                            const std::string& in = "") {
    ASSIGN_OR_RETURN(FnCallResult r, Call(lang, code, timeout, memory_mb, in));
    return Outcome(r.run, r.sandbox_error);
  }
  std::string dir_;
  std::unique_ptr<FnCallPool> pool_;
};

TEST_F(FnCallTest, PythonSuccessStdinAndErrors) {
  ASSERT_OK_AND_ASSIGN(ExecOutcome r, Run("python", "import sys\nprint(sum(map(int, sys.stdin.read().split())))",
                                          milliseconds(10000), 256, "1 2 3"));
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.stdout_data, "6\n");
  ASSERT_OK_AND_ASSIGN(r, Run("python", "raise ValueError('boom')"));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.stderr_data.find("ValueError: boom"), std::string::npos) << r.stderr_data;
  ASSERT_OK_AND_ASSIGN(r, Run("python", "import sys; sys.exit(7)"));
  EXPECT_EQ(r.exit_code, 7);
  // Python code runs as PID 1 of its namespace (no extra fork): faults still
  // kill it and are reported as signals.
  ASSERT_OK_AND_ASSIGN(r, Run("python", "import ctypes; ctypes.string_at(0)"));
  EXPECT_EQ(r.signal, SIGSEGV);
  EXPECT_EQ(r.exit_code, 128 + SIGSEGV);
  ASSERT_OK_AND_ASSIGN(r, Run("bash", "kill -9 $$"));
  EXPECT_EQ(r.signal, SIGKILL);
  EXPECT_EQ(r.exit_code, 137);
  ASSERT_OK_AND_ASSIGN(r, Run("python", "import sys; sys.stdout.buffer.write(bytes([0, 255, 10]))"));
  EXPECT_EQ(r.stdout_data, std::string("\0\xff\n", 3));
}

TEST_F(FnCallTest, BashAndNoNetwork) {
  ASSERT_OK_AND_ASSIGN(ExecOutcome r, Run("bash", "echo hi $((6*7)); echo err >&2; exit 3"));
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_EQ(r.stdout_data, "hi 42\n");
  EXPECT_EQ(r.stderr_data, "err\n");
  ASSERT_OK_AND_ASSIGN(r, Run("bash", "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '"));
  EXPECT_EQ(r.stdout_data, "lo\n");
  ASSERT_OK_AND_ASSIGN(
      r, Run("python",
             "import socket\ntry:\n  socket.create_connection(('1.1.1.1', 53), timeout=2)\nexcept OSError as e:\n  "
             "print('no network', e.errno)"));
  EXPECT_EQ(r.stdout_data.substr(0, 10), "no network") << r.stdout_data;
  ASSERT_OK_AND_ASSIGN(r, Run("bash", "touch /usr/x 2>&1; id -u; cat /proc/self/status | grep CapEff"));
  EXPECT_NE(r.stdout_data.find("Read-only file system"), std::string::npos) << r.stdout_data;
  EXPECT_NE(r.stdout_data.find("CapEff:\t0000000000000000"), std::string::npos) << r.stdout_data;
}

TEST_F(FnCallTest, NothingCarriesOverBetweenCalls) {
  // max_workers=2 and sequential calls: the same warm worker serves them.
  for (int i = 0; i < 3; ++i) {
    ASSERT_OK_AND_ASSIGN(
        ExecOutcome r,
        Run("python",
            "import os, json, subprocess\n"
            "seen = {'file': os.path.exists('/tmp/mark'), 'env': os.environ.get('MARK'),\n"
            "        'shm': os.listdir('/dev/shm'), 'ipc': open('/proc/sysvipc/shm').read().count('\\n'),\n"
            "        'patched': hasattr(json, 'warren_mark'),\n"
            "        'procs': len([p for p in os.listdir('/proc') if p.isdigit()])}\n"
            "print(json.dumps(seen, sort_keys=True))\n"
            "open('/tmp/mark', 'w').write('x'); os.environ['MARK'] = '1'; json.warren_mark = 1\n"
            "open('/dev/shm/mark', 'w').write('x')\n"
            "import ctypes; libc = ctypes.CDLL(None); assert libc.shmget(0, 4096, 0o1600) >= 0\n"
            "try:\n  open('/dev/mark', 'w')\nexcept OSError as e:\n  assert e.errno == 30, e\n"
            "json.dumps = lambda *a, **k: 'PATCHED'\n"
            "subprocess.Popen(['sleep', '1000'], start_new_session=True)\n"));
    EXPECT_EQ(r.exit_code, 0) << r.stderr_data;
    // procs: only the call's python process itself (PID 1 of its namespace).
    EXPECT_EQ(r.stdout_data,
              "{\"env\": null, \"file\": false, \"ipc\": 1, \"patched\": false, \"procs\": 1, \"shm\": []}\n")
        << "call " << i;
  }
  EXPECT_LE(pool_->Stats().spawned, 2u);
}

TEST_F(FnCallTest, TimeoutForkBombOomAndClosedStdoutLeaveThePoolHealthy) {
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_OK_AND_ASSIGN(ExecOutcome r,
                       Run("python", "print('start', flush=True)\nwhile True: pass", milliseconds(1000)));
  EXPECT_TRUE(r.timed_out);
  EXPECT_EQ(r.stdout_data, "start\n");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));

  // The bomb is bounded by the worker's pids limit and dies with the call's
  // pid namespace when the time-out kills the call.
  t0 = std::chrono::steady_clock::now();
  ASSERT_OK_AND_ASSIGN(r, Run("bash", ":(){ :|:& };:; sleep 5", milliseconds(2000)));
  EXPECT_TRUE(r.timed_out);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(6));

  ASSERT_OK_AND_ASSIGN(r, Run("python", "x = bytearray(10 << 30)\nprint('survived')", milliseconds(20000), 256));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_TRUE(r.oom_killed || r.stderr_data.find("MemoryError") != std::string::npos)
      << r.exit_code << " " << r.stderr_data;

  ASSERT_OK_AND_ASSIGN(
      r, Run("python", "import os, time\nos.close(1)\ntime.sleep(0.2)\nprint('x', file=__import__('sys').stderr)"));
  EXPECT_EQ(r.stderr_data, "x\n");

  ASSERT_OK_AND_ASSIGN(r, Run("python", "print('still fine')"));
  EXPECT_EQ(r.stdout_data, "still fine\n");
}

TEST_F(FnCallTest, FilesInAndOut) {
  FnCallRequest q;
  q.language = "python";
  q.code = "d = open('data/in.txt').read()\nopen('out.txt', 'w').write(d.upper())";
  q.files["data/in.txt"] = "hello";
  q.fetch_files = {"out.txt", "nope.txt"};
  ASSERT_OK_AND_ASSIGN(FnCallResult r, pool_->Call({BaseRootfs()}, q));
  ASSERT_OK_AND_ASSIGN(ExecOutcome run, Outcome(r.run, r.sandbox_error));
  EXPECT_EQ(run.exit_code, 0) << run.stderr_data;
  EXPECT_EQ(r.files["out.txt"], "HELLO");
  EXPECT_EQ(r.missing_files, std::vector<std::string>{"nope.txt"});
  q.files.clear();
  q.files["../../etc/x"] = "no";
  ASSERT_OK_AND_ASSIGN(r, pool_->Call({BaseRootfs()}, q));
  EXPECT_NE(r.sandbox_error.find("escapes"), std::string::npos) << r.sandbox_error;
}

std::string ToolsetRootfs() {
  const char* e = ::getenv("WARREN_TOOLSET_ROOTFS");
  return e ? e : "/var/cache/warren/rootfs/toolset-gcc";
}

TEST_F(FnCallTest, CppWithoutCompilerIsAClearSandboxError) {
  struct stat st;
  if (::stat((BaseRootfs() + "/usr/bin/g++").c_str(), &st) == 0) GTEST_SKIP() << "base rootfs has g++";
  ASSERT_OK_AND_ASSIGN(FnCallResult r, Call("cpp", "int main(){}"));
  EXPECT_FALSE(r.run.has_value());
  EXPECT_NE(r.sandbox_error.find("g++ is not in this image"), std::string::npos) << r.sandbox_error;
}

// Two layers (base + a gcc toolset, scripts/build-toolset-gcc-rootfs.sh): the
// worker root is a read-only overlay of both.
TEST_F(FnCallTest, CppCompileErrorRunAndTimeoutOnToolsetLayer) {
  struct stat st;
  if (::stat((ToolsetRootfs() + "/usr/bin/g++").c_str(), &st) != 0)
    GTEST_SKIP() << "no toolset rootfs with g++ at " << ToolsetRootfs()
                 << " (scripts/build-toolset-gcc-rootfs.sh builds one; or set WARREN_TOOLSET_ROOTFS)";
  const std::vector<std::string> layers = {BaseRootfs(), ToolsetRootfs()};
  auto call = [&](const std::string& code, milliseconds timeout) {
    FnCallRequest q;
    q.language = "cpp";
    q.code = code;
    q.run_timeout = timeout;
    q.compile_timeout = milliseconds(60000);
    q.stdin_data = "20 22";
    return pool_->Call(layers, q);
  };
  ASSERT_OK_AND_ASSIGN(FnCallResult r,
                       call("#include <iostream>\nint main(){int a,b; std::cin>>a>>b; std::cout<<a+b<<std::endl;}",
                            milliseconds(10000)));
  ASSERT_OK_AND_ASSIGN(ExecOutcome compile, Outcome(r.compile, r.sandbox_error));
  EXPECT_EQ(compile.exit_code, 0) << compile.stderr_data;
  ASSERT_OK_AND_ASSIGN(ExecOutcome run, Outcome(r.run, r.sandbox_error));
  EXPECT_EQ(run.stdout_data, "42\n") << run.stderr_data;
  ASSERT_OK_AND_ASSIGN(r, call("int main( {", milliseconds(10000)));
  ASSERT_OK_AND_ASSIGN(compile, Outcome(r.compile, r.sandbox_error));
  EXPECT_NE(compile.exit_code, 0);
  EXPECT_NE(compile.stderr_data.find("error"), std::string::npos);
  EXPECT_FALSE(r.run.has_value());
  ASSERT_OK_AND_ASSIGN(r, call("int main(){return *(volatile int*)0;}", milliseconds(10000)));
  ASSERT_OK_AND_ASSIGN(run, Outcome(r.run, r.sandbox_error));
  EXPECT_EQ(run.signal, SIGSEGV);
  ASSERT_OK_AND_ASSIGN(r, call("int main(){for(;;);}", milliseconds(1000)));
  ASSERT_OK_AND_ASSIGN(run, Outcome(r.run, r.sandbox_error));
  EXPECT_TRUE(run.timed_out);
}

TEST_F(FnCallTest, MemoryLimitFollowsEachCallAndNothingIsLeftBehind) {
  for (uint32_t mb : {128u, 1024u, 128u}) {
    ASSERT_OK_AND_ASSIGN(ExecOutcome r,
                         Run("python", "x = bytearray(300 << 20); print(len(x) >> 20)", milliseconds(20000), mb));
    if (mb == 1024) {
      EXPECT_EQ(r.stdout_data, "300\n") << r.stderr_data;
    } else {
      EXPECT_NE(r.exit_code, 0);
      EXPECT_TRUE(r.oom_killed || r.stderr_data.find("MemoryError") != std::string::npos);
    }
  }
  auto mgr = jail::CgroupManager::Detect(CgroupName());
  ASSERT_OK(mgr);
  const std::string dir =
      std::string((*mgr)->version() == 1 ? "/sys/fs/cgroup/memory" : "/sys/fs/cgroup") + (*mgr)->parent();
  auto workers = [&] {
    int n = 0;
    if (DIR* d = ::opendir(dir.c_str())) {
      while (dirent* e = ::readdir(d)) n += e->d_name[0] == 'w';
      ::closedir(d);
    }
    return n;
  };
  EXPECT_GE(workers(), 1);
  pool_.reset();
  EXPECT_EQ(workers(), 0) << dir;
}

TEST_F(FnCallTest, ConcurrentCallsAndShrink) {
  constexpr int kThreads = 4;
  std::vector<std::thread> ts;
  ts.reserve(kThreads);
  std::atomic<int> ok{0};
  for (int i = 0; i < kThreads; ++i) {
    ts.emplace_back([&, i] {
      for (int j = 0; j < 10; ++j) {
        FnCallRequest q;
        q.code = "print(" + std::to_string(i * 100 + j) + ")";
        auto r = pool_->Call({BaseRootfs()}, q);
        if (r.ok() && r->run && r->run->stdout_data == std::to_string(i * 100 + j) + "\n") ++ok;
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(ok.load(), 40);
  EXPECT_LE(pool_->Stats().workers, 2u);
  pool_->Shrink(milliseconds(0));
  EXPECT_EQ(pool_->Stats().workers, 0u);
}

// Python code runs as PID 1 of its pid namespace (or, with fetch_files, as
// its child): either way a catchable signal it sends itself ends it with that
// signal, and a handler it installs itself still wins.
TEST_F(FnCallTest, PythonSelfSignalEndsTheCall) {
  for (bool fetch : {false, true}) {
    FnCallRequest q;
    q.code = "import os, time\nprint('a', flush=True)\nos.kill(os.getpid(), 15)\ntime.sleep(5)\nprint('b')";
    if (fetch) q.fetch_files = {"none.txt"};
    ASSERT_OK_AND_ASSIGN(FnCallResult r, pool_->Call({BaseRootfs()}, q));
    ASSERT_OK_AND_ASSIGN(ExecOutcome run, Outcome(r.run, r.sandbox_error));
    EXPECT_EQ(run.signal, SIGTERM) << "fetch=" << fetch;
    EXPECT_EQ(run.exit_code, 128 + SIGTERM) << "fetch=" << fetch;
    EXPECT_EQ(run.stdout_data, "a\n");
  }
  ASSERT_OK_AND_ASSIGN(ExecOutcome r,
                       Run("python",
                           "import signal, os\nsignal.signal(signal.SIGUSR1, lambda s, f: print('caught', s))\n"
                           "os.kill(os.getpid(), signal.SIGUSR1)\nprint('after')"));
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.stdout_data, "caught 10\nafter\n");
}

// The CommandRunner face of fncall (backend.h): ExecSpec in, ExecOutcome out.
TEST_F(FnCallTest, RunnerMapsExecSpec) {
  FnCallRunner runner(pool_.get(), {BaseRootfs()}, 256);
  CommandRunner& cr = runner;
  ExecSpec s;
  s.argv = {"printf", "%s|", "it's", "two words", "$HOME"};
  auto o = cr.Exec(s);
  ASSERT_OK(o);
  EXPECT_EQ(o->exit_code, 0);
  EXPECT_EQ(o->stdout_data, "it's|two words|$HOME|");
  s = ExecSpec{};
  s.shell = "pwd; echo $X; cat; exit 5";
  s.env = {{"X", "y"}};
  s.cwd = "/tmp/sub";
  s.stdin_data = "in";
  o = cr.Exec(s);
  ASSERT_OK(o);
  EXPECT_EQ(o->exit_code, 5);
  EXPECT_EQ(o->stdout_data, "/tmp/sub\ny\nin");
  s = ExecSpec{};
  s.shell = "sleep 30";
  s.timeout = milliseconds(300);
  o = cr.Exec(s);
  ASSERT_OK(o);
  EXPECT_TRUE(o->timed_out);
  EXPECT_EQ(o->signal, SIGKILL);
  s = ExecSpec{};
  s.shell = "true";
  s.user = "nobody";
  EXPECT_THAT(cr.Exec(s), StatusIs(absl::StatusCode::kInvalidArgument));
  s.user = "";
  s.cwd = "/etc";
  EXPECT_THAT(cr.Exec(s), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace warren::runtime

namespace warren::runtime {
namespace {
// Not a correctness test: prints the pool's raw call rate (bench/fncall has
// the end-to-end benchmark). Run with --gtest_also_run_disabled_tests.
TEST_F(FnCallTest, DISABLED_RawThroughput) {
  for (int conc : {1, 2, 4}) {
    std::atomic<int> done{0};
    auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> ts;
    ts.reserve(conc);
    for (int i = 0; i < conc; ++i) {
      ts.emplace_back([&] {
        for (int j = 0; j < 300 / conc; ++j) {
          FnCallRequest q;
          q.code = "print(1+1)";
          auto r = pool_->Call({BaseRootfs()}, q);
          if (r.ok() && r->run && r->run->stdout_data == "2\n") ++done;
        }
      });
    }
    for (auto& t : ts) t.join();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    printf("concurrency %d: %d calls in %.2fs = %.0f calls/s\n", conc, done.load(), s, done / s);
  }
}
}  // namespace
}  // namespace warren::runtime

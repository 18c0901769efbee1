// The container backend on the real kernel (run as root). The image is a
// host directory holding a static busybox (Debian busybox-static) with its
// applets as symlinks, plus /etc/passwd; it is used read-only as the lower
// layer, idmapped like an EROFS layer would be.
#include "runtime/container/container_backend.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <sys/wait.h>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "image/layer_tree.h"
#include "jail/cgroup.h"
#include "runtime/container/record.pb.h"
#include "status_matchers.h"

namespace warren::runtime {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// The container's record of a sandbox (its Record(), parsed).
container::record::Container RecordOf(const Sandbox& sb) {
  container::record::Container r;
  EXPECT_TRUE(r.ParseFromString(sb.Record()));
  return r;
}
std::vector<std::string> CgroupDirs(const Sandbox& sb) {
  container::record::Container r = RecordOf(sb);
  return {r.cgroup_dirs().begin(), r.cgroup_dirs().end()};
}
using namespace std::chrono_literals;

std::string Sh(const std::string& cmd) {
  std::string out;
  FILE* f = ::popen(cmd.c_str(), "r");
  if (!f) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  ::pclose(f);
  return out;
}

// Builds the busybox image once per test binary.
const std::string& BusyboxImage() {
  // Leaked on purpose: the atexit hook below must still see it.
  static const std::string& dir = *new std::string([] {
    std::atexit([] { fs::remove_all(BusyboxImage()); });
    char tmpl[] = "/tmp/warren-ct-image-XXXXXX";
    std::string d = ::mkdtemp(tmpl);
    ::chmod(d.c_str(), 0755);
    fs::create_directories(d + "/bin");
    fs::create_directories(d + "/etc");
    fs::create_directories(d + "/w");
    fs::create_directories(d + "/root");
    fs::copy_file("/bin/busybox", d + "/bin/busybox");
    std::string list = Sh("/bin/busybox --list");
    std::istringstream in(list);
    for (std::string applet; std::getline(in, applet);) {
      if (applet.empty() || applet == "busybox") continue;
      ::symlink("busybox", (d + "/bin/" + applet).c_str());
    }
    std::ofstream(d + "/etc/passwd") << "root:x:0:0:root:/root:/bin/sh\n"
                                     << "agent:x:1000:1000:agent:/w:/bin/sh\n"
                                     << "nobody:x:65534:65534:nobody:/:/bin/false\n";
    std::ofstream(d + "/etc/group") << "root:x:0:\nagent:x:1000:\n";
    std::ofstream(d + "/etc/hostname-image") << "image\n";
    return d;
  }());
  return dir;
}

ExecSpec Argv(std::vector<std::string> argv) {
  ExecSpec e;
  e.argv = std::move(argv);
  return e;
}

// Mounts in the host's mount namespace under any test sandbox's dir (the
// backend attaches nothing there: everything stays detached until it is
// inside the sandbox). Counting only these keeps the check exact while other
// tests or daemons on the host mount and unmount their own things.
std::string HostMountsOfTestSandboxes() { return Sh("grep -c ' /tmp/warren-ct-sb-' /proc/self/mountinfo || true"); }

class ContainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root";
    ContainerOptions o;
    o.init_path = WARREN_INIT_PATH;
    o.cgroup_name = "warren-test-" + std::to_string(::getpid());
    o.uid_base = 2000000 + (static_cast<uint32_t>(::getpid()) % 64) * 65536 * 32;
    o.max_sandboxes = 32;
    auto b = NewContainerBackend(o);
    ASSERT_OK(b);
    backend_ = std::move(*b);
    options_ = o;
  }
  void TearDown() override {
    for (auto& [sb, dir] : sandboxes_) {
      if (sb) (void)sb->Destroy();
      fs::remove_all(dir);
    }
    sandboxes_.clear();
    backend_.reset();
    auto m = jail::CgroupManager::Detect(options_.cgroup_name);
    if (m.ok()) {
      // The subtree root itself (<own>/warren-test-<pid>) in every hierarchy.
      for (const char* c : {"cpu", "memory", "pids", "freezer", "cpuset", "cpuacct"}) {
        std::string own = Sh(std::string("grep -E ':([^:]*,)?") + c + "(,[^:]*)?:' /proc/self/cgroup | cut -d: -f3");
        while (!own.empty() && own.back() == '\n') own.pop_back();
        std::string p = std::string("/sys/fs/cgroup/") + c + (own == "/" ? "" : own) + "/" + options_.cgroup_name;
        ::rmdir(p.c_str());
      }
    }
  }

  SandboxSpec Spec(const std::string& id) {
    SandboxSpec s;
    s.id = id;
    char tmpl[] = "/tmp/warren-ct-sb-XXXXXX";
    s.dir = ::mkdtemp(tmpl);
    s.lower_dirs = {BusyboxImage()};
    s.resources.memory_mb = 256;
    s.resources.disk_mb = 64;
    s.resources.pids = 256;
    s.resources.tmpfs_mb = 16;
    return s;
  }

  Sandbox* Make(const std::string& id, SandboxSpec* out_spec = nullptr) {
    SandboxSpec s = Spec(id);
    if (out_spec) *out_spec = s;
    auto sb = backend_->Create(s);
    EXPECT_OK(sb);
    if (!sb.ok()) {
      fs::remove_all(s.dir);
      return nullptr;
    }
    sandboxes_.emplace_back(std::move(*sb), s.dir);
    return sandboxes_.back().first.get();
  }

  ExecOutcome Run(Sandbox* sb, const std::string& cmd, std::chrono::milliseconds timeout = 20s,
                  const std::string& in = "") {
    ExecSpec e;
    e.shell = cmd;
    e.timeout = timeout;
    e.stdin_data = in;
    auto r = sb->Exec(e);
    EXPECT_OK(r);
    return r.ok() ? *r : ExecOutcome{};
  }

  std::unique_ptr<Backend> backend_;
  ContainerOptions options_;
  std::vector<std::pair<std::unique_ptr<Sandbox>, std::string>> sandboxes_;
};

TEST(ContainerProbe, HostFeatures) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root";
  HostFeatures f = ProbeHostFeatures();
  EXPECT_TRUE(f.cgroup_version == 1 || f.cgroup_version == 2);
  EXPECT_THAT(f.cgroup_parent, HasSubstr("/warren"));
  EXPECT_TRUE(f.user_namespaces);
  EXPECT_TRUE(f.idmapped_mounts);  // kernel 6.x: required by Create
}

TEST_F(ContainerTest, EchoHi) {
  Sandbox* sb = Make("echo-hi");
  ASSERT_NE(sb, nullptr);
  ExecOutcome r = Run(sb, "echo hi");
  EXPECT_EQ(r.stdout_data, "hi\n");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.signal, 0);
  EXPECT_EQ(r.stderr_data, "");
  EXPECT_EQ(r.stdout_total, 3u);
  EXPECT_FALSE(r.timed_out);
}

TEST_F(ContainerTest, NamespacesIdentityAndInit) {
  Sandbox* sb = Make("ns-id");
  ASSERT_NE(sb, nullptr);
  EXPECT_EQ(Run(sb, "hostname").stdout_data, "ns-id\n");
  EXPECT_EQ(Run(sb, "id -u; id -g").stdout_data, "0\n0\n");
  // Layer files (root-owned on the host) appear owned by root inside.
  EXPECT_EQ(Run(sb, "stat -c %u:%g /bin/busybox").stdout_data, "0:0\n");
  // PID 1 is warren-init; its one argument is the fd it keeps on the upper.
  EXPECT_THAT(Run(sb, "tr '\\0' ' ' < /proc/1/cmdline").stdout_data, ::testing::MatchesRegex("warren-init [0-9]+ "));
  // PID 1 costs well under 1 MiB and survives signals sent from inside.
  ExecOutcome rss =
      Run(sb, "kill -TERM 1; kill -INT 1; kill -HUP 1; sleep 0.1; awk '/VmRSS/ {print ($2 < 1024)}' /proc/1/status");
  EXPECT_EQ(rss.stdout_data, "1\n");
  // Only loopback, and it is up.
  ExecOutcome net = Run(sb, "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '");
  EXPECT_EQ(net.stdout_data, "lo\n");
  EXPECT_EQ(Run(sb, "cat /sys/class/net/lo/operstate 2>/dev/null || echo none").exit_code, 0);
  // The host's pid 1 and processes are invisible.
  EXPECT_EQ(Run(sb, "ls /proc | grep -c '^[0-9]' | awk '{print ($1 < 10)}'").stdout_data, "1\n");
  // Writable root (overlay upper), /tmp sticky.
  EXPECT_EQ(Run(sb, "echo x > /newfile && cat /newfile && stat -c %a /tmp").stdout_data, "x\n1777\n");
}

TEST_F(ContainerTest, A01NonUtf8BytesExact) {
  Sandbox* sb = Make("a01");
  ASSERT_NE(sb, nullptr);
  ExecOutcome r = Run(sb, "printf 'ok \\377\\376\\215 end\\n'; printf 'err \\303\\050\\n' >&2; exit 3");
  EXPECT_EQ(r.exit_code, 3);
  EXPECT_EQ(r.stdout_data, std::string("ok \xff\xfe\x8d end\n"));
  EXPECT_EQ(r.stderr_data, std::string("err \xc3\x28\n"));
}

TEST_F(ContainerTest, A02NulBytesAndRandomFileRoundTrip) {
  Sandbox* sb = Make("a02");
  ASSERT_NE(sb, nullptr);
  ExecOutcome r = Run(sb, "printf 'a\\0b\\0c'");
  EXPECT_EQ(r.stdout_data, std::string("a\0b\0c", 5));
  std::string data(1 << 20, '\0');
  std::mt19937_64 rng(42);
  for (auto& c : data) c = static_cast<char>(rng());
  auto w = sb->files().OpenWrite("/w/random.bin", 0644, true);
  ASSERT_OK(w);
  ASSERT_OK((*w)->Write(data));
  auto n = (*w)->Commit();
  ASSERT_OK(n);
  EXPECT_EQ(*n, data.size());
  ExecOutcome cat = Run(sb, "cat /w/random.bin");
  EXPECT_EQ(cat.stdout_data.size(), data.size());
  EXPECT_TRUE(cat.stdout_data == data);
  // Owned by the sandbox's root, seen from inside.
  EXPECT_EQ(Run(sb, "stat -c %u:%g /w/random.bin").stdout_data, "0:0\n");
}

TEST_F(ContainerTest, A03HugeOutputIsTruncatedWithTotals) {
  Sandbox* sb = Make("a03");
  ASSERT_NE(sb, nullptr);
  auto t0 = std::chrono::steady_clock::now();
  ExecOutcome r = Run(sb, "yes x | head -c 300000000", 60s);
  auto dt = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.stdout_total, 300000000u);
  EXPECT_TRUE(r.stdout_truncated);
  EXPECT_EQ(r.stdout_data.size(), 16u << 20);
  EXPECT_LT(dt, 30s);
  ExecOutcome e = Run(sb, "head -c 200000 /dev/zero >&2; echo done");
  EXPECT_EQ(e.stdout_data, "done\n");
  EXPECT_EQ(e.stderr_data, std::string(200000, '\0'));
  EXPECT_FALSE(e.stderr_truncated);
  ExecSpec small;
  small.shell = "seq 1 100000";
  small.output_cap_bytes = 10;
  auto s = sb->Exec(small);
  ASSERT_OK(s);
  EXPECT_EQ(s->stdout_data, "1\n2\n3\n4\n5\n");
  EXPECT_TRUE(s->stdout_truncated);
  EXPECT_EQ(s->stdout_total, 588895u);
}

TEST_F(ContainerTest, A04TimeoutKillsTheWholeTree) {
  Sandbox* sb = Make("a04");
  ASSERT_NE(sb, nullptr);
  auto t0 = std::chrono::steady_clock::now();
  ExecOutcome r = Run(sb, "echo start; sleep 10", 1s);
  auto dt = std::chrono::steady_clock::now() - t0;
  EXPECT_TRUE(r.timed_out);
  EXPECT_EQ(r.stdout_data, "start\n");
  EXPECT_LT(dt, 3s);
  EXPECT_GE(dt, 900ms);
  EXPECT_EQ(Run(sb, "ps -o comm | grep -c sleep").stdout_data, "0\n");
  // setsid'ed, double-forked and TERM-ignoring descendants go too.
  t0 = std::chrono::steady_clock::now();
  ExecSpec e;
  e.shell = "setsid sh -c 'trap \"\" TERM; sleep 100' & (sh -c 'sleep 101 &' &); trap '' TERM; sleep 102";
  e.timeout = 1s;
  e.kill_grace = 300ms;
  auto k = sb->Exec(e);
  ASSERT_OK(k);
  EXPECT_TRUE(k->timed_out);
  EXPECT_EQ(k->signal, SIGKILL);
  EXPECT_EQ(k->exit_code, 128 + SIGKILL);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 4s);
  EXPECT_EQ(Run(sb, "ps -o comm | grep -c sleep").stdout_data, "0\n");
}

TEST_F(ContainerTest, A05BackgroundChildHoldingStdoutReturnsAtOnce) {
  Sandbox* sb = Make("a05");
  ASSERT_NE(sb, nullptr);
  for (int i = 0; i < 2; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    ExecOutcome r = Run(sb, "sh -c 'sleep 1000 &'; echo back");
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
    EXPECT_EQ(r.exit_code, 0);
    EXPECT_EQ(r.stdout_data, "back\n");
  }
  auto t0 = std::chrono::steady_clock::now();
  // (Debian's busybox has no nohup applet: setsid is the same kind of escape.)
  ExecOutcome r = Run(sb, "setsid tail -f /dev/null &");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
  EXPECT_EQ(r.exit_code, 0);
  // Policy: background processes keep running until the sandbox is destroyed.
  EXPECT_EQ(Run(sb, "sleep 0.3; ps -o comm | grep -c -e sleep -e tail").stdout_data, "3\n");
}

TEST_F(ContainerTest, A06Stdin) {
  Sandbox* sb = Make("a06");
  ASSERT_NE(sb, nullptr);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(Run(sb, "cat; echo done", 5s).stdout_data, "done\n");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
  EXPECT_EQ(Run(sb, "read -r x; echo rc=$?").stdout_data, "rc=1\n");
  EXPECT_EQ(Run(sb, "cat", 5s, "abc").stdout_data, "abc");
  std::string big(3 << 20, 'z');
  EXPECT_EQ(Run(sb, "wc -c", 10s, big).stdout_data, std::to_string(big.size()) + "\n");
  // A reader that stops early must not hang or kill the daemon (EPIPE).
  EXPECT_EQ(Run(sb, "head -c 1", 10s, big).stdout_data, "z");
}

TEST_F(ContainerTest, A07ExitStatus) {
  Sandbox* sb = Make("a07");
  ASSERT_NE(sb, nullptr);
  ExecOutcome r = Run(sb, "kill -9 $$");
  EXPECT_EQ(r.exit_code, 137);
  EXPECT_EQ(r.signal, 9);
  EXPECT_FALSE(r.oom_killed);
  r = Run(sb, "kill -TERM $$");
  EXPECT_EQ(r.exit_code, 143);
  EXPECT_EQ(r.signal, 15);
  EXPECT_EQ(Run(sb, "exit 255").exit_code, 255);
  EXPECT_EQ(Run(sb, "exit 300").exit_code, 44);
  r = Run(sb, "no-such-command-xyz");
  EXPECT_EQ(r.exit_code, 127);
  EXPECT_THAT(r.stderr_data, HasSubstr("not found"));
  EXPECT_EQ(Run(sb, "true").exit_code, 0);
  ExecSpec e;
  e.argv = {"no-such-binary"};
  auto a = sb->Exec(e);
  ASSERT_OK(a);
  EXPECT_EQ(a->exit_code, 127);
  EXPECT_THAT(a->stderr_data, HasSubstr("not found"));
}

TEST_F(ContainerTest, A08ZombiesAreReapedByInit) {
  Sandbox* sb = Make("a08");
  ASSERT_NE(sb, nullptr);
  Run(sb, "for i in 1 2 3 4 5; do sh -c 'sh -c \"sleep 1\" &' & wait; done");
  std::this_thread::sleep_for(2500ms);
  EXPECT_EQ(Run(sb, "ps -o stat | grep -c '^Z'").stdout_data, "0\n");
  for (int i = 0; i < 200; ++i) {
    ExecOutcome r = Run(sb, "sh -c 'sh -c true &' &");
    ASSERT_EQ(r.exit_code, 0);
  }
  EXPECT_EQ(Run(sb, "echo ok").stdout_data, "ok\n");
}

TEST_F(ContainerTest, ExecEnvCwdUser) {
  SandboxSpec s = Spec("env");
  s.env = {{"A", "1"}, {"B", "two words"}};
  s.workdir = "/w";
  auto c = backend_->Create(s);
  ASSERT_OK(c);
  sandboxes_.emplace_back(std::move(*c), s.dir);
  Sandbox* sb = sandboxes_.back().first.get();
  ExecSpec e;
  e.argv = {"env"};
  e.env = {{"B", "over"}, {"C", "\xff"}};
  auto r = sb->Exec(e);
  ASSERT_OK(r);
  // HOME: the user's, as a login sets it.
  EXPECT_EQ(r->stdout_data,
            "A=1\nB=over\nC=\xff\nHOME=/root\nPATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n");
  EXPECT_EQ(Run(sb, "pwd").stdout_data, "/w\n");
  // A workdir missing from the image is created, owned by the sandbox's root.
  SandboxSpec s2 = Spec("workdir");
  s2.workdir = "/home/agent/repo";
  auto c2 = backend_->Create(s2);
  ASSERT_OK(c2);
  sandboxes_.emplace_back(std::move(*c2), s2.dir);
  EXPECT_EQ(Run(sandboxes_.back().first.get(), "pwd; stat -c %u .").stdout_data, "/home/agent/repo\n0\n");
  e.argv = {"pwd"};
  e.cwd = "/bin";
  EXPECT_EQ(sb->Exec(e)->stdout_data, "/bin\n");
  e.cwd = "/does/not/exist";
  auto bad = sb->Exec(e);
  EXPECT_THAT(bad, ::testing::Not(IsOk()));
  EXPECT_THAT(bad.status().message(), HasSubstr("/does/not/exist"));
  e.cwd = "";
  e.argv = {"id"};
  e.user = "agent";
  EXPECT_THAT(sb->Exec(e)->stdout_data, HasSubstr("uid=1000(agent) gid=1000(agent)"));
  e.user = "1234:5678";
  EXPECT_THAT(sb->Exec(e)->stdout_data, HasSubstr("uid=1234 gid=5678"));
  e.user = "nosuchuser";
  EXPECT_THAT(sb->Exec(e), StatusIs(absl::StatusCode::kNotFound));
  // A non-root user has no capabilities at all.
  e.argv = {"sh", "-c", "grep CapEff /proc/self/status"};
  e.user = "agent";
  EXPECT_EQ(sb->Exec(e)->stdout_data, "CapEff:\t0000000000000000\n");
}

TEST_F(ContainerTest, ContainmentCapsSeccompMasks) {
  Sandbox* sb = Make("jail");
  ASSERT_NE(sb, nullptr);
  // Docker-like minimal set for root: 0xa80425fb minus MKNOD(27), NET_RAW(13) = 0xa00405fb.
  EXPECT_EQ(Run(sb, "grep -E '^(CapEff|CapBnd|NoNewPrivs)' /proc/self/status").stdout_data,
            "CapEff:\t00000000a00405fb\nCapBnd:\t00000000a00405fb\nNoNewPrivs:\t1\n");
#ifdef WARREN_HAVE_SECCOMP
  EXPECT_EQ(Run(sb, "grep '^Seccomp:' /proc/self/status").stdout_data, "Seccomp:\t2\n");
#endif
  // No nested namespaces / mounts from inside.
  EXPECT_NE(Run(sb, "unshare -r true 2>/dev/null").exit_code, 0);
  EXPECT_NE(Run(sb, "mount -t tmpfs x /mnt 2>/dev/null").exit_code, 0);
  // Masked /proc paths read as empty, /proc/sys is read-only.
  EXPECT_EQ(
      Run(sb, "cat /proc/kcore /proc/kpagecgroup /proc/kpageflags /proc/sysrq-trigger /proc/keys 2>/dev/null | wc -c")
          .stdout_data,
      "0\n");
  EXPECT_NE(Run(sb, "echo 1 > /proc/sys/kernel/domainname").exit_code, 0);
  EXPECT_NE(Run(sb, "echo c > /proc/sysrq-trigger; echo x > /sys/kernel/uevent_helper").exit_code, 0);
  // /dev is minimal.
  EXPECT_EQ(Run(sb, "ls /dev | tr '\\n' ' '").stdout_data,
            "core fd full mqueue null ptmx pts random shm stderr stdin stdout tty urandom zero ");
  EXPECT_EQ(Run(sb, "head -c 4 /dev/zero | wc -c; echo x > /dev/null && echo ok").stdout_data, "4\nok\n");
  EXPECT_NE(Run(sb, "mknod /tmp/sda b 8 0 2>/dev/null").exit_code, 0);
}

TEST_F(ContainerTest, A09FilesNeverEscapeTheSandboxRoot) {
  Sandbox* sb = Make("a09");
  ASSERT_NE(sb, nullptr);
  const std::string tag = "warren-pwned-" + std::to_string(::getpid());
  ASSERT_EQ(Run(sb, "ln -s / /escape && mkdir -p /w && ln -s /etc /w/link && ln -s /tmp /w/tmplink").exit_code, 0);
  for (const std::string& p : {"../../tmp/" + tag, "/w/../../../../tmp/" + tag, "..%2f..%2ftmp%2f" + tag,
                               "/escape/tmp/" + tag, "/w/tmplink/" + tag, "/w/link/" + tag}) {
    auto w = sb->files().OpenWrite(p, 0644, true);
    if (w.ok()) {
      ASSERT_OK((*w)->Write("x"));
      (void)(*w)->Commit();
    }
    EXPECT_FALSE(fs::exists("/tmp/" + tag)) << p;
    EXPECT_FALSE(fs::exists("/etc/" + tag)) << p;
  }
  // What landed, landed inside.
  EXPECT_EQ(Run(sb, "cat /tmp/" + tag + " /etc/" + tag).stdout_data, "xx");
  auto st = sb->files().Stat("/escape");
  ASSERT_OK(st);
  EXPECT_EQ(st->type, FileType::kSymlink);
  EXPECT_EQ(st->symlink_target, "/");
  auto ls = sb->files().List("/w/link/..");
  ASSERT_OK(ls);
  bool saw_busybox_bin = false;
  for (const auto& f : *ls) saw_busybox_bin |= f.name == "bin";
  EXPECT_TRUE(saw_busybox_bin);
  auto rd = sb->files().OpenRead("/escape/etc/passwd", 0, 0);
  ASSERT_OK(rd);
  auto text = (*rd)->Read(1 << 16);
  ASSERT_OK(text);
  EXPECT_THAT(*text, HasSubstr("agent:x:1000"));  // the sandbox's passwd, not the host's
}

TEST_F(ContainerTest, A14ForkBombStaysInItsSandbox) {
  SandboxSpec s = Spec("bomb");
  s.resources.pids = 64;
  auto a = backend_->Create(s);
  ASSERT_OK(a);
  sandboxes_.emplace_back(std::move(*a), s.dir);
  Sandbox* bomb = sandboxes_.back().first.get();
  Sandbox* b = Make("calm");
  ASSERT_NE(b, nullptr);
  std::thread t([&] {
    ExecSpec e;
    e.shell = ":(){ :|:& };:";
    e.timeout = 4s;
    auto r = bomb->Exec(e);
    EXPECT_OK(r);
  });
  std::chrono::nanoseconds worst{0};
  for (int i = 0; i < 6; ++i) {
    std::this_thread::sleep_for(500ms);
    auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(Run(b, "echo ok").stdout_data, "ok\n");
    worst = std::max(worst, std::chrono::steady_clock::now() - t0);
  }
  t.join();
  EXPECT_LT(worst, 1s);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_OK(bomb->Destroy());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
}

TEST_F(ContainerTest, A15OutOfMemory) {
  SandboxSpec s = Spec("oom");
  s.resources.memory_mb = 64;
  auto a = backend_->Create(s);
  ASSERT_OK(a);
  sandboxes_.emplace_back(std::move(*a), s.dir);
  Sandbox* sb = sandboxes_.back().first.get();
  ASSERT_EQ(Run(sb, "echo keep > /w/keep").exit_code, 0);
  ExecOutcome r = Run(sb, "awk 'BEGIN { s = \"xxxxxxxxxxxxxxxx\"; while (1) s = s s }'", 30s);
  EXPECT_EQ(r.exit_code, 137);
  EXPECT_EQ(r.signal, 9);
  EXPECT_TRUE(r.oom_killed);
  EXPECT_EQ(Run(sb, "cat /w/keep").stdout_data, "keep\n");
  EXPECT_FALSE(Run(sb, "echo ok").oom_killed);
}

TEST_F(ContainerTest, A16DiskFull) {
  Sandbox* sb = Make("disk");  // disk_mb = 64, tmpfs_mb = 16
  ASSERT_NE(sb, nullptr);
  ExecOutcome r = Run(sb, "dd if=/dev/zero of=/big bs=1M count=128");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.stderr_data, HasSubstr("No space left"));
  auto w = sb->files().OpenWrite("/more", 0644, false);
  if (w.ok()) {
    Status ws = (*w)->Write(std::string(1 << 20, 'a'));
    StatusOr<uint64_t> c = ws.ok() ? (*w)->Commit() : StatusOr<uint64_t>(ws);
    EXPECT_THAT(c, ::testing::Not(IsOk()));
    EXPECT_THAT(c, StatusIs(absl::StatusCode::kResourceExhausted));
  }
  EXPECT_EQ(Run(sb, "rm /big && dd if=/dev/zero of=/big bs=1M count=32 2>/dev/null && echo ok").stdout_data, "ok\n");
  r = Run(sb, "dd if=/dev/zero of=/dev/shm/big bs=1M count=64");
  EXPECT_THAT(r.stderr_data, HasSubstr("No space left"));
  EXPECT_EQ(Run(sb, "df -m /dev/shm | tail -1 | awk '{print $2}'").stdout_data, "16\n");
}

TEST_F(ContainerTest, ConcurrentExecs) {
  Sandbox* sb = Make("conc");
  ASSERT_NE(sb, nullptr);
  constexpr int kThreads = 4;
  std::vector<std::thread> ts;
  ts.reserve(kThreads);
  std::atomic<int> good{0};
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      for (int i = 0; i < 10; ++i) {
        ExecSpec e;
        e.shell = "echo " + std::to_string(t * 100 + i) + "; sleep 0.0" + std::to_string(i);
        auto r = sb->Exec(e);
        if (r.ok() && r->stdout_data == std::to_string(t * 100 + i) + "\n") good++;
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(good.load(), 40);
}

TEST_F(ContainerTest, DestroyLeavesNothingAndIsIdempotent) {
  std::string mounts_before = HostMountsOfTestSandboxes();
  SandboxSpec spec;
  Sandbox* sb = Make("gone", &spec);
  ASSERT_NE(sb, nullptr);
  Run(sb, "sh -c 'trap \"\" TERM; sleep 1000 & sleep 1000 & wait' &");
  pid_t init = sb->init_pid();
  std::vector<std::string> dirs = CgroupDirs(*sb);
  ASSERT_FALSE(dirs.empty());
  for (const auto& d : dirs) EXPECT_TRUE(fs::exists(d)) << d;
  // Exec concurrent with Destroy returns promptly.
  std::thread t([&] {
    ExecSpec e;
    e.shell = "sleep 100";
    auto r = sb->Exec(e);
    if (r.ok()) {
      EXPECT_EQ(r->signal, SIGKILL);
    }
  });
  std::this_thread::sleep_for(200ms);
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_OK(sb->Destroy());
  t.join();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 3s);
  EXPECT_OK(sb->Destroy());
  for (const auto& d : dirs) EXPECT_FALSE(fs::exists(d)) << d;
  EXPECT_NE(::kill(init, 0), 0);
  EXPECT_FALSE(fs::exists(spec.dir));
  EXPECT_EQ(HostMountsOfTestSandboxes(), mounts_before);
  EXPECT_THAT(sb->Exec(Argv({"true"})), ::testing::Not(IsOk()));
  EXPECT_THAT(sb->files().Stat("/"), ::testing::Not(IsOk()));
}

TEST_F(ContainerTest, AdoptAfterRestart) {
  SandboxSpec spec;
  Sandbox* sb = Make("adopt", &spec);
  ASSERT_NE(sb, nullptr);
  ASSERT_EQ(Run(sb, "echo state > /w/f").exit_code, 0);
  const std::string rec = sb->Record();
  auto b2 = NewContainerBackend(options_);
  ASSERT_OK(b2);
  auto again = (*b2)->Adopt(spec, rec);
  ASSERT_OK(again);
  EXPECT_EQ((*again)->init_pid(), sb->init_pid());
  ExecSpec e;
  e.shell = "cat /w/f; hostname";
  auto r = (*again)->Exec(e);
  ASSERT_OK(r);
  EXPECT_EQ(r->stdout_data, "state\nadopt\n");
  // A record whose init is gone (or reused) is NotFound.
  container::record::Container stale = RecordOf(*sb);
  stale.set_init_start_time(stale.init_start_time() + 1);
  EXPECT_THAT((*b2)->Adopt(spec, stale.SerializeAsString()), StatusIs(absl::StatusCode::kNotFound));
  ASSERT_OK((*again)->Destroy());
  EXPECT_THAT((*b2)->Adopt(spec, rec), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(ContainerTest, CleanupFromIdAndDirOnly) {
  SandboxSpec spec;
  Sandbox* sb = Make("crashed", &spec);
  ASSERT_NE(sb, nullptr);
  Run(sb, "sleep 1000 &");
  auto dirs = CgroupDirs(*sb);
  pid_t init = sb->init_pid();
  SandboxSpec minimal;
  minimal.id = spec.id;
  minimal.dir = spec.dir;
  ASSERT_OK(backend_->Cleanup(minimal, ""));
  for (const auto& d : dirs) EXPECT_FALSE(fs::exists(d)) << d;
  std::this_thread::sleep_for(50ms);
  (void)::waitpid(init, nullptr, WNOHANG);
  EXPECT_NE(::kill(init, 0), 0);
  EXPECT_FALSE(fs::exists(spec.dir));
  EXPECT_OK(backend_->Cleanup(minimal, ""));  // idempotent
  // Cleanup of something that never got further than its dir.
  char tmpl[] = "/tmp/warren-ct-sb-XXXXXX";
  std::string half = ::mkdtemp(tmpl);
  ::mkdir((half + "/rootfs").c_str(), 0755);
  SandboxSpec half_spec;
  half_spec.id = "half";
  half_spec.dir = half;
  EXPECT_OK(backend_->Cleanup(half_spec, ""));
  EXPECT_FALSE(fs::exists(half + "/rootfs"));
  fs::remove_all(half);
}

TEST_F(ContainerTest, CreateFailureLeavesNothing) {
  SandboxSpec s = Spec("broken");
  s.lower_dirs = {"/nonexistent/layer"};
  auto r = backend_->Create(s);
  EXPECT_THAT(r, ::testing::Not(IsOk()));
  EXPECT_THAT(r.status().message(), HasSubstr("/nonexistent/layer"));
  EXPECT_FALSE(fs::exists(s.dir + "/rootfs"));
  EXPECT_THAT(jail::CgroupManager::Detect(options_.cgroup_name).value()->Open("broken"), ::testing::Not(IsOk()));
  fs::remove_all(s.dir);
}

// The Debian rootfs another engineer debootstraps (read-only lower layer), with
// a second "workspace" layer stacked on top.
TEST_F(ContainerTest, DebianLayersPythonStdinOom) {
  const std::string base = "/var/cache/warren/rootfs/debian-12";
  if (!fs::exists(base + ".complete") || !fs::exists(base + "/usr/bin/python3"))
    GTEST_SKIP() << base << " not (yet) debootstrapped";
  char tmpl[] = "/tmp/warren-ct-ws-XXXXXX";
  std::string ws = ::mkdtemp(tmpl);
  ::chmod(ws.c_str(), 0755);
  fs::create_directories(ws + "/w");
  std::ofstream(ws + "/w/task.txt") << "task\n";
  std::ofstream(ws + "/etc-os-release-override") << "x\n";
  SandboxSpec s = Spec("debian");
  s.lower_dirs = {base, ws};
  s.resources.memory_mb = 256;
  auto c = backend_->Create(s);
  ASSERT_OK(c);
  sandboxes_.emplace_back(std::move(*c), s.dir);
  Sandbox* sb = sandboxes_.back().first.get();
  EXPECT_EQ(Run(sb, "cat /w/task.txt; . /etc/os-release; echo $ID").stdout_data, "task\ndebian\n");
  EXPECT_EQ(Run(sb, "python3 -c 'import sys;print(repr(sys.stdin.read()))'", 20s, "abc").stdout_data, "'abc'\n");
  EXPECT_EQ(Run(sb, "stat -c %U:%G /usr/bin/python3.11 /etc/shadow").stdout_data, "root:root\nroot:shadow\n");
  ExecOutcome nf = Run(sb, "definitely-not-a-command");
  EXPECT_EQ(nf.exit_code, 127);
  EXPECT_THAT(nf.stderr_data, HasSubstr("not found"));
  ExecOutcome oom = Run(sb, "python3 -c 'x=bytearray(2<<30)'", 60s);
  EXPECT_EQ(oom.exit_code, 137);
  EXPECT_TRUE(oom.oom_killed);
  EXPECT_EQ(Run(sb, "echo ok").stdout_data, "ok\n");
  // apt-style writes over a lower file are copied up, the layer is untouched.
  EXPECT_EQ(Run(sb, "echo changed > /etc/hostname && cat /etc/hostname").stdout_data, "changed\n");
  EXPECT_NE(Sh("cat " + base + "/etc/hostname"), "changed\n");
  EXPECT_OK(sb->Destroy());
  fs::remove_all(ws);
}

// A lower that cannot be idmapped (overlayfs) is used un-idmapped.
TEST_F(ContainerTest, NonIdmappableLowerFallsBack) {
  char tmpl[] = "/tmp/warren-ct-ovl-XXXXXX";
  std::string d = ::mkdtemp(tmpl);
  ::chmod(d.c_str(), 0755);
  for (const char* s : {"/l", "/u", "/w", "/m"}) fs::create_directories(d + s);
  std::ofstream(d + "/l/from-ovl") << "ovl\n";
  ::chmod((d + "/l/from-ovl").c_str(), 0644);
  std::string opts = "lowerdir=" + d + "/l,upperdir=" + d + "/u,workdir=" + d + "/w";
  ASSERT_EQ(::mount("overlay", (d + "/m").c_str(), "overlay", 0, opts.c_str()), 0) << strerror(errno);
  SandboxSpec s = Spec("ovl-lower");
  s.lower_dirs = {BusyboxImage(), d + "/m"};
  auto c = backend_->Create(s);
  if (c.ok()) {
    ExecSpec e;
    e.shell = "cat /from-ovl; stat -c %u /from-ovl";
    auto r = (*c)->Exec(e);
    ASSERT_OK(r);
    EXPECT_EQ(r->stdout_data, "ovl\n65534\n");
    EXPECT_OK((*c)->Destroy());
  }
  fs::remove_all(s.dir);
  EXPECT_EQ(::umount2((d + "/m").c_str(), 0), 0);
  fs::remove_all(d);
  ASSERT_OK(c);
}

// Processes on the host whose real uid falls in this backend's uid range and
// whose cgroup lies under this backend's cgroup (`cgroup_name`). The cgroup
// filter keeps the count to this test process's sandboxes: another test
// binary run in parallel (ctest -j) can map an overlapping uid range, and a
// sandbox's processes cannot leave its cgroup (they cannot write cgroup.procs).
int ProcessesInUidRange(uint32_t base, uint32_t span, const std::string& cgroup_name) {
  int n = 0;
  for (const auto& e : fs::directory_iterator("/proc")) {
    std::string name = e.path().filename();
    if (name.empty() || !isdigit(static_cast<unsigned char>(name[0]))) continue;
    bool in_range = false;
    std::ifstream st(e.path() / "status");
    for (std::string line; std::getline(st, line);) {
      if (line.rfind("Uid:", 0) == 0) {
        uint64_t uid = std::strtoull(line.c_str() + 4, nullptr, 10);
        in_range = uid >= base && uid < base + uint64_t{span};
        break;
      }
    }
    if (!in_range) continue;
    std::ifstream cg(e.path() / "cgroup");
    for (std::string line; std::getline(cg, line);) {
      if (line.find("/" + cgroup_name + "/") != std::string::npos || line.ends_with("/" + cgroup_name)) {
        ++n;
        break;
      }
    }
  }
  return n;
}

TEST_F(ContainerTest, A12A13ConcurrentCyclesLeaveNothing) {
  const std::string mounts_before = HostMountsOfTestSandboxes();
  const uint32_t span = options_.uid_range * options_.max_sandboxes;
  const int procs_before = ProcessesInUidRange(options_.uid_base, span, options_.cgroup_name);
  std::atomic<int> ok{0};
  constexpr int kThreads = 4;
  std::vector<std::thread> ts;
  ts.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      for (int i = 0; i < 12; ++i) {
        SandboxSpec s = Spec("cyc-" + std::to_string(t) + "-" + std::to_string(i));
        auto sb = backend_->Create(s);
        if (!sb.ok()) {
          ADD_FAILURE() << sb.status();
          fs::remove_all(s.dir);
          continue;
        }
        ExecSpec bg;
        bg.shell = "sh -c 'trap \"\" TERM; sleep 1000 & sleep 1000 & wait' &";
        auto r = (*sb)->Exec(bg);
        if (r.ok() && r->exit_code == 0) ++ok;
        if (t == 0 && i == 0) {  // the count below sees a live sandbox's processes
          EXPECT_GT(ProcessesInUidRange(options_.uid_base, span, options_.cgroup_name), procs_before);
        }
        std::thread mid;
        if (i % 3 == 0) {  // destroyed mid-exec
          mid = std::thread([&sb] {
            ExecSpec e;
            e.shell = "echo started; sleep 100";
            (void)(*sb)->Exec(e);
          });
          std::this_thread::sleep_for(20ms);
        }
        Status d = (*sb)->Destroy();
        EXPECT_OK(d);
        if (mid.joinable()) mid.join();
        fs::remove_all(s.dir);
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(ok.load(), 48);
  EXPECT_EQ(HostMountsOfTestSandboxes(), mounts_before);
  // Processes die asynchronously after SIGKILL of their pid namespace's init;
  // Destroy waited for the cgroups to be empty, so nothing may remain.
  EXPECT_EQ(ProcessesInUidRange(options_.uid_base, span, options_.cgroup_name), procs_before);
  auto mgr = jail::CgroupManager::Detect(options_.cgroup_name);
  ASSERT_OK(mgr);
  auto root = (*mgr)->Open("");
  ASSERT_OK(root);
  for (const auto& d : (*root)->dirs()) {
    int subdirs = 0;
    for (const auto& e : fs::directory_iterator(d)) subdirs += e.is_directory();
    EXPECT_EQ(subdirs, 0) << d;
  }
}

TEST_F(ContainerTest, CreateExecDestroyIsFast) {
  std::chrono::nanoseconds best = std::chrono::hours(1);
  for (int i = 0; i < 5; ++i) {
    SandboxSpec s = Spec("fast-" + std::to_string(i));
    auto t0 = std::chrono::steady_clock::now();
    auto sb = backend_->Create(s);
    ASSERT_OK(sb);
    auto r = (*sb)->Exec(Argv({"true"}));
    ASSERT_OK(r);
    ASSERT_OK((*sb)->Destroy());
    best = std::min(best, std::chrono::steady_clock::now() - t0);
    fs::remove_all(s.dir);
  }
  std::printf("create+exec+destroy best of 5: %.1f ms\n", best.count() / 1e6);
  EXPECT_LT(best, 500ms);
}

// ---- Sandbox::Start (issue 3): a process the caller pumps.
std::string ReadToEof(int fd) {
  std::string out;
  char buf[4096];
  for (int i = 0; i < 100000; ++i) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // EOF, or EIO once a PTY's slave is closed everywhere
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

ExecOutcome WaitFor(Process& p) {
  ExecOutcome o;
  for (int i = 0; i < 2000; ++i) {
    auto r = p.TryWait(&o);
    EXPECT_OK(r);
    if (!r.ok() || *r) break;
    std::this_thread::sleep_for(10ms);
  }
  return o;
}

TEST_F(ContainerTest, ReportsEveryCapabilityAndImplementsThem) {
  EXPECT_EQ(backend_->capabilities().ToString(), "pause,suspend,processes,export_changes");
  Sandbox* sb = Make("caps");
  ASSERT_NE(sb, nullptr);
  EXPECT_EQ(sb->backend_name(), backend_->name());
  EXPECT_NE(As<Pausable>(*sb), nullptr);
  EXPECT_NE(As<Suspendable>(*sb), nullptr);
  EXPECT_NE(As<ProcessStarter>(*sb), nullptr);
  EXPECT_NE(As<ChangeExporter>(*sb), nullptr);
}

// The changes come out in the layer format: ids as seen inside (shifted back
// from the host range), deletions as 0:0 char devices, a recreated directory
// opaque, excluded subtrees absent, the overlay's own xattrs gone.
TEST_F(ContainerTest, ExportChangesYieldsTheLayerFormat) {
  Sandbox* sb = Make("export");
  ASSERT_NE(sb, nullptr);
  ExecOutcome r = Run(sb,
                      "rm /etc/hostname-image && rm -rf /root && mkdir /root && echo r > /root/new && "
                      "echo a > /w/a && chown 1000:1000 /w/a && mkdir /cache && echo x > /cache/x && "
                      "echo y > /w/b.pyc");
  ASSERT_EQ(r.exit_code, 0) << r.stderr_data;
  ChangeExporter* ex = As<ChangeExporter>(*sb);
  ASSERT_NE(ex, nullptr);
  char tmpl[] = "/tmp/warren-export-XXXXXX";
  const std::string root = ::mkdtemp(tmpl);
  const std::string dst = root + "/changes";
  image::CopyBudget budget("sandbox export", 64 << 20);
  ExportOptions o;
  o.exclude = {"/cache/", "*.pyc"};
  o.budget = &budget;
  Status s = ex->ExportChanges(dst, o);
  ASSERT_OK(s);
  EXPECT_GT(budget.used(), 0u);
  struct stat st;
  ASSERT_EQ(::lstat((dst + "/etc/hostname-image").c_str(), &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  EXPECT_EQ(st.st_rdev, makedev(0, 0));
  ASSERT_EQ(::lstat((dst + "/root").c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_uid, 0u);
  char v[4] = {};
  EXPECT_EQ(::lgetxattr((dst + "/root").c_str(), "trusted.overlay.opaque", v, sizeof v), 1);
  EXPECT_EQ(v[0], 'y');
  ASSERT_EQ(::lstat((dst + "/root/new").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 0u);
  EXPECT_EQ(st.st_gid, 0u);
  ASSERT_EQ(::lstat((dst + "/w/a").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 1000u);
  EXPECT_EQ(st.st_gid, 1000u);
  EXPECT_EQ(st.st_size, 2);
  EXPECT_NE(::lstat((dst + "/cache").c_str(), &st), 0);
  EXPECT_NE(::lstat((dst + "/w/b.pyc").c_str(), &st), 0);
  // Only the opaque/whiteout markers of trusted.overlay.* are kept.
  std::string names(4096, '\0');
  for (const char* p : {"/", "/root", "/w", "/w/a"}) {
    ssize_t n = ::llistxattr((dst + p).c_str(), names.data(), names.size());
    ASSERT_GE(n, 0) << p;
    for (size_t off = 0; off < static_cast<size_t>(n);) {
      std::string name(names.data() + off);
      off += name.size() + 1;
      if (name.rfind("trusted.overlay.", 0) == 0) {
        EXPECT_EQ(name, "trusted.overlay.opaque") << p;
      }
      EXPECT_NE(name.rfind("security.", 0), 0u) << p << " " << name;
    }
  }
  // dst must be new; after Destroy the changes are gone.
  EXPECT_THAT(ex->ExportChanges(dst, o), ::testing::Not(IsOk()));
  ASSERT_OK(sb->Destroy());
  EXPECT_THAT(ex->ExportChanges(root + "/again", o), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_FALSE(fs::exists(root + "/again"));
  fs::remove_all(root);
}

TEST_F(ContainerTest, StartPipesControlFdAndNewSession) {
  Sandbox* sb = Make("start-pipes");
  ASSERT_NE(sb, nullptr);
  ExecSpec es;
  es.shell =
      "read x; echo \"got $x\"; echo err >&2; echo ctl >&3; "
      "read -r _ _ _ _ _ sid _ < /proc/$$/stat; test \"$sid\" = $$ && echo leader; exit 5";
  StartOptions so;
  so.control_fd = true;
  auto p = As<ProcessStarter>(*sb)->Start(es, so);
  ASSERT_OK(p);
  UniqueFd in = (*p)->TakeStdin(), out = (*p)->TakeStdout(), err = (*p)->TakeStderr(), ctl = (*p)->TakeControl();
  ASSERT_TRUE(in.valid() && out.valid() && err.valid() && ctl.valid());
  ASSERT_EQ(::write(in.get(), "hi\n", 3), 3);
  in.reset();
  EXPECT_EQ(ReadToEof(out.get()), "got hi\nleader\n");
  EXPECT_EQ(ReadToEof(err.get()), "err\n");
  EXPECT_EQ(ReadToEof(ctl.get()), "ctl\n");
  ExecOutcome o = WaitFor(**p);
  EXPECT_EQ(o.exit_code, 5);
  EXPECT_TRUE((*p)->TreeEmpty());
}

TEST_F(ContainerTest, StartOnAPtyFromTheSandboxDevpts) {
  Sandbox* sb = Make("start-pty");
  ASSERT_NE(sb, nullptr);
  ExecSpec es;
  es.shell = "test -t 0 && test -t 1 && test -t 2 && echo tty; tty; stty size";
  StartOptions so;
  so.pty = true;
  so.rows = 31;
  so.cols = 97;
  auto p = As<ProcessStarter>(*sb)->Start(es, so);
  ASSERT_OK(p);
  EXPECT_FALSE((*p)->TakeStderr().valid());  // merged into the terminal
  UniqueFd in = (*p)->TakeStdin();
  UniqueFd out = (*p)->TakeStdout();
  std::string text = ReadToEof(out.get());
  ExecOutcome o = WaitFor(**p);
  EXPECT_EQ(o.exit_code, 0) << text;
  EXPECT_NE(text.find("tty\r\n/dev/pts/0\r\n31 97\r\n"), std::string::npos) << text;
}

TEST_F(ContainerTest, StartSignalsTheWholeTreeAndReportsBadCwd) {
  Sandbox* sb = Make("start-tree");
  ASSERT_NE(sb, nullptr);
  ExecSpec es;
  es.shell = "setsid sleep 300 & (sleep 301 &); echo up; wait";
  auto p = As<ProcessStarter>(*sb)->Start(es, StartOptions{});
  ASSERT_OK(p);
  UniqueFd out = (*p)->TakeStdout();
  char buf[3];
  ASSERT_EQ(::read(out.get(), buf, 3), 3);
  // "up" may come before the backgrounded subshells have exec'd sleep: poll (bounded).
  std::string n_sleeps;
  for (int i = 0; i < 100 && (n_sleeps = Run(sb, "ps | grep -c 'sleep 30[01]$'").stdout_data) != "2\n"; ++i)
    std::this_thread::sleep_for(20ms);
  EXPECT_EQ(n_sleeps, "2\n");
  ASSERT_OK((*p)->Signal(SIGKILL, true));
  ExecOutcome o = WaitFor(**p);
  EXPECT_EQ(o.signal, SIGKILL);
  for (int i = 0; i < 100 && !(*p)->TreeEmpty(); ++i) std::this_thread::sleep_for(20ms);
  EXPECT_TRUE((*p)->TreeEmpty());
  EXPECT_EQ(Run(sb, "ps | grep -c 'sleep 30[01]$'").stdout_data, "0\n");
  ExecSpec bad;
  bad.shell = "true";
  bad.cwd = "/no/such/dir";
  EXPECT_EQ(As<ProcessStarter>(*sb)->Start(bad, StartOptions{}).status().code(), absl::StatusCode::kNotFound);
}

// ---- warm pool (issue 3 "fast")

// Pids of this process's children that are still warm shells (not yet warren-init).
std::vector<pid_t> WarmShellChildren() {
  std::vector<pid_t> out;
  std::error_code ec;
  for (fs::directory_iterator it("/proc", ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    // C I/O: the process may vanish between listing and reading.
    FILE* f = std::fopen(("/proc/" + name + "/stat").c_str(), "re");
    if (f == nullptr) continue;
    char buf[512];
    size_t n = std::fread(buf, 1, sizeof buf - 1, f);
    std::fclose(f);
    std::string stat(buf, n);
    size_t l = stat.find('('), r = stat.rfind(')');
    if (l == std::string::npos || r == std::string::npos || r + 4 >= stat.size()) continue;
    std::istringstream rest(stat.substr(r + 2));
    std::string state;
    pid_t ppid = 0;
    rest >> state >> ppid;
    if (ppid == ::getpid() && stat.substr(l + 1, r - l - 1) == "warren-shell" && state != "Z")
      out.push_back(static_cast<pid_t>(std::stoi(name)));
  }
  return out;
}

// The memory limit (MiB; and memsw if asked) and pids.max of a sandbox's
// cgroup, in whichever of its hierarchies holds them.
void ExpectCgroupLimits(Sandbox& sb, uint64_t memory_mb, uint32_t pids, bool memsw) {
  std::vector<const char*> files = {"memory.limit_in_bytes", "pids.max"};
  if (memsw) files.push_back("memory.memsw.limit_in_bytes");
  for (const auto& d : CgroupDirs(sb)) {
    for (const char* f : files) {
      if (!fs::exists(d + "/" + f)) continue;
      std::ifstream in(d + "/" + f);
      std::string v;
      in >> v;
      EXPECT_EQ(v, std::string(f) == "pids.max" ? std::to_string(pids) : std::to_string(memory_mb << 20))
          << d << "/" << f;
    }
  }
}

// Names of shell-* cgroups under the test's subtree (any hierarchy).
std::set<std::string> ShellCgroups(const std::string& cgroup_name) {
  std::set<std::string> out;
  auto m = jail::CgroupManager::Detect(cgroup_name);
  if (!m.ok()) return out;
  auto root = (*m)->Open("");
  if (!root.ok()) return out;
  for (const std::string& d : (*root)->dirs()) {
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(d, ec)) {
      const std::string n = e.path().filename();
      if (e.is_directory() && n.rfind("shell-", 0) == 0) out.insert(n);
    }
  }
  return out;
}

class WarmShellTest : public ContainerTest {
 protected:
  void SetUp() override {
    ContainerTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    backend_.reset();
    options_.warm_shells = 2;
    auto b = NewContainerBackend(options_);
    ASSERT_OK(b);
    backend_ = std::move(*b);
  }
  // Waits (bounded) for the pool to hold n shells.
  ::testing::AssertionResult WaitForShells(size_t n) {
    size_t have = 0;
    for (int i = 0; i < 1500; ++i) {
      have = WarmShellChildren().size();
      if (have == n) return ::testing::AssertionSuccess();
      std::this_thread::sleep_for(20ms);
    }
    return ::testing::AssertionFailure() << have << " warm shells, not " << n;
  }
};

TEST_F(WarmShellTest, CreateTakesAShellThatBecomesExactlyTheAskedSandbox) {
  // No shell before the first create (the node re-adopts sandboxes first).
  EXPECT_TRUE(WarmShellChildren().empty());
  Sandbox* first = Make("warm-first");
  ASSERT_NE(first, nullptr);
  ASSERT_TRUE(WaitForShells(2));
  EXPECT_EQ(ShellCgroups(options_.cgroup_name).size(), 2u);
  const std::vector<pid_t> shells = WarmShellChildren();

  SandboxSpec spec = Spec("warm-second");
  spec.hostname = "warm-host";
  spec.resources.memory_mb = 200;
  spec.resources.pids = 77;
  spec.resources.open_files = 333;
  spec.resources.tmpfs_mb = 8;
  auto sb = backend_->Create(spec);
  ASSERT_OK(sb);
  sandboxes_.emplace_back(std::move(*sb), spec.dir);
  Sandbox* s = sandboxes_.back().first.get();
  // It was one of the pool's shells.
  EXPECT_NE(std::find(shells.begin(), shells.end(), s->init_pid()), shells.end()) << s->init_pid();
  // Its cgroup carries the sandbox's name and limits, everywhere.
  container::record::Container rec = RecordOf(*s);
  std::vector<std::string> dirs(rec.cgroup_dirs().begin(), rec.cgroup_dirs().end());
  ASSERT_FALSE(dirs.empty());
  for (const auto& d : dirs) {
    EXPECT_EQ(fs::path(d).filename(), "warm-second") << d;
    if (fs::exists(d + "/init/cgroup.procs") || fs::exists(d + "/memory.limit_in_bytes")) {
      std::ifstream p2(fs::exists(d + "/init/cgroup.procs") ? d + "/init/cgroup.procs" : d + "/cgroup.procs");
      std::string pid;
      p2 >> pid;
      EXPECT_EQ(pid, std::to_string(s->init_pid())) << d;
    }
    if (fs::exists(d + "/memory.limit_in_bytes")) {
      std::ifstream f(d + "/memory.limit_in_bytes");
      uint64_t v = 0;
      f >> v;
      EXPECT_EQ(v, 200ull << 20);
    }
    if (fs::exists(d + "/pids.max")) {
      std::ifstream f(d + "/pids.max");
      std::string v;
      f >> v;
      EXPECT_EQ(v, "77");
    }
  }
  EXPECT_EQ(rec.cgroup(), "warm-second");
  EXPECT_EQ(Run(s, "hostname; ulimit -n; df -k /dev/shm | tail -1 | awk '{print $2}'; cat /proc/1/comm").stdout_data,
            "warm-host\n333\n8192\nwarren-init\n");
  // The pool refills; destroying the sandbox leaves nothing of it.
  ASSERT_TRUE(WaitForShells(2));
  EXPECT_EQ(ShellCgroups(options_.cgroup_name).size(), 2u);
  ASSERT_OK(s->Destroy());
  for (const auto& d : dirs) EXPECT_FALSE(fs::exists(d)) << d;
  // Shells now carry the latest create's limits (200 MiB, 77 pids); one asked
  // for more gets them raised (v1: memsw first).
  {
    SandboxSpec big = Spec("warm-big");
    big.resources.memory_mb = 300;
    big.resources.pids = 100;
    std::vector<pid_t> pool = WarmShellChildren();
    auto b = backend_->Create(big);
    ASSERT_OK(b);
    sandboxes_.emplace_back(std::move(*b), big.dir);
    Sandbox* bs = sandboxes_.back().first.get();
    EXPECT_NE(std::find(pool.begin(), pool.end(), bs->init_pid()), pool.end());
    ExpectCgroupLimits(*bs, 300, 100, /*memsw=*/true);
    EXPECT_EQ(Run(bs, "echo ok").stdout_data, "ok\n");
    ASSERT_OK(bs->Destroy());
    ASSERT_TRUE(WaitForShells(2));
  }
  // A shell that died is never handed out.
  std::vector<pid_t> now = WarmShellChildren();
  ASSERT_EQ(now.size(), 2u);
  for (pid_t p : now) ::kill(p, SIGKILL);
  Sandbox* third = Make("warm-third");
  ASSERT_NE(third, nullptr);
  EXPECT_EQ(Run(third, "echo ok").stdout_data, "ok\n");
  // The backend's end kills the pool's shells and removes their cgroups.
  ASSERT_TRUE(WaitForShells(2));
  for (auto& [sbx, dir] : sandboxes_) {
    if (sbx) (void)sbx->Destroy();
  }
  backend_.reset();
  EXPECT_TRUE(WarmShellChildren().empty());
  EXPECT_TRUE(ShellCgroups(options_.cgroup_name).empty());
}

TEST_F(WarmShellTest, ConcurrentCreatesBeyondThePoolAllSucceed) {
  constexpr int kCreates = 8;
  std::vector<std::thread> ts;
  ts.reserve(kCreates);
  std::vector<SandboxSpec> specs;
  specs.reserve(kCreates);
  for (int i = 0; i < kCreates; ++i) specs.push_back(Spec("warm-c" + std::to_string(i)));
  std::vector<StatusOr<std::unique_ptr<Sandbox>>> res;
  res.reserve(kCreates);
  for (int i = 0; i < kCreates; ++i) res.emplace_back(absl::UnknownError("not run"));
  for (int i = 0; i < kCreates; ++i) ts.emplace_back([&, i] { res[i] = backend_->Create(specs[i]); });
  for (auto& t : ts) t.join();
  for (int i = 0; i < kCreates; ++i) {
    ASSERT_OK(res[i]);
    sandboxes_.emplace_back(std::move(*res[i]), specs[i].dir);
    EXPECT_EQ(Run(sandboxes_.back().first.get(), "hostname").stdout_data, "warm-c" + std::to_string(i) + "\n");
  }
}

// Cgroup recycling (ContainerOptions::recycled_cgroups, cgroup v1): a
// destroyed sandbox's emptied cgroup becomes the next sandbox's, renamed and
// re-limited, its children (exec cgroups) gone; the backend's end removes
// whatever is left unused.
TEST_F(ContainerTest, DestroyedSandboxCgroupIsRecycledRenamedAndRelimited) {
  auto m = jail::CgroupManager::Detect(options_.cgroup_name);
  ASSERT_OK(m);
  if ((*m)->version() != 1) GTEST_SKIP() << "cgroup v2 host: cgroups are not recycled (no rename)";
  backend_.reset();
  options_.recycled_cgroups = 4;
  auto b = NewContainerBackend(options_);
  ASSERT_OK(b);
  backend_ = std::move(*b);

  Sandbox* a = Make("recycle-a");
  ASSERT_NE(a, nullptr);
  // A background process keeps its exec cgroup (a child) alive until the destroy.
  EXPECT_EQ(Run(a, "sleep 100 >/dev/null 2>&1 & echo started").stdout_data, "started\n");
  const auto a_dirs = CgroupDirs(*a);
  ASSERT_FALSE(a_dirs.empty());
  // Destroyed while paused: its cgroup is recycled thawed, never frozen.
  ASSERT_TRUE(As<Pausable>(*a)->Pause().ok());
  ASSERT_OK(a->Destroy());
  EXPECT_FALSE(As<Pausable>(*a)->Pause().ok());  // nothing freezes it after the destroy
  for (const auto& d : a_dirs) EXPECT_FALSE(fs::exists(d)) << d;
  const std::set<std::string> kept = ShellCgroups(options_.cgroup_name);
  ASSERT_EQ(kept.size(), 1u);
  const std::string name = *kept.begin();
  EXPECT_EQ(name.rfind("shell-" + std::to_string(::getpid()) + "-r", 0), 0u) << name;
  for (const auto& d : a_dirs) {
    const std::string r = fs::path(d).parent_path() / name;
    ASSERT_TRUE(fs::exists(r)) << r;
    size_t children = 0;
    for (const auto& e : fs::directory_iterator(r))
      if (e.is_directory()) ++children;
    EXPECT_EQ(children, 0u) << r << ": the exec cgroup was not removed";
    std::ifstream procs(r + "/cgroup.procs");
    std::string any;
    EXPECT_FALSE(procs >> any) << r << " still holds a process";
    if (fs::exists(r + "/freezer.state")) {
      std::ifstream fz(r + "/freezer.state");
      std::string state;
      fz >> state;
      EXPECT_EQ(state, "THAWED") << r;
    }
  }
  // A late call through the destroyed sandbox reaches nothing.
  ExecSpec late;
  late.shell = "true";
  EXPECT_THAT(a->Exec(late), ::testing::Not(IsOk()));

  SandboxSpec spec = Spec("recycle-b");
  spec.resources.memory_mb = 200;
  spec.resources.pids = 77;
  auto sb = backend_->Create(spec);
  ASSERT_OK(sb);
  sandboxes_.emplace_back(std::move(*sb), spec.dir);
  Sandbox* bsb = sandboxes_.back().first.get();
  EXPECT_TRUE(ShellCgroups(options_.cgroup_name).empty()) << "the recycled cgroup was not taken";
  for (const auto& d : CgroupDirs(*bsb)) EXPECT_EQ(fs::path(d).filename(), "recycle-b") << d;
  ExpectCgroupLimits(*bsb, 200, 77, /*memsw=*/false);
  EXPECT_EQ(Run(bsb, "echo ok; cat /proc/1/comm").stdout_data, "ok\nwarren-init\n");
  ASSERT_OK(bsb->Destroy());
  EXPECT_EQ(ShellCgroups(options_.cgroup_name).size(), 1u);
  // A sandbox that was the first to read 4 MiB of a lower file leaves that
  // page cache charged to its memory cgroup: removed (the kernel moves the
  // charge to the parent), not recycled.
  {
    char tmpl[] = "/tmp/warren-ct-cache-XXXXXX";
    const std::string lower = ::mkdtemp(tmpl);
    ::chmod(lower.c_str(), 0755);
    {
      int fd = ::open((lower + "/big").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      ASSERT_GE(fd, 0);
      std::string chunk(1 << 20, 'x');
      for (int i = 0; i < 4; ++i)
        ASSERT_EQ(::write(fd, chunk.data(), chunk.size()), static_cast<ssize_t>(chunk.size()));
      ASSERT_EQ(::fsync(fd), 0);
      ASSERT_EQ(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);  // out of the page cache
      ::close(fd);
    }
    SandboxSpec cs = Spec("recycle-c");
    cs.lower_dirs = {BusyboxImage(), lower};
    auto c = backend_->Create(cs);
    ASSERT_OK(c);
    const auto c_dirs = CgroupDirs(**c);
    ExecSpec rd;
    rd.shell = "cat /big > /dev/null && echo read";
    auto r = (*c)->Exec(rd);
    ASSERT_OK(r);
    EXPECT_EQ(r->stdout_data, "read\n");
    const size_t before = ShellCgroups(options_.cgroup_name).size();
    ASSERT_OK((*c)->Destroy());
    EXPECT_EQ(ShellCgroups(options_.cgroup_name).size(), before) << "a cgroup holding 4 MiB of page cache was recycled";
    for (const auto& d : c_dirs) EXPECT_FALSE(fs::exists(d)) << d;
    c->reset();
    fs::remove_all(cs.dir);
    fs::remove_all(lower);
  }
  // The backend's end (its last sandbox object gone) removes the unused recycled cgroups.
  for (auto& [sbx, dir] : sandboxes_) fs::remove_all(dir);
  sandboxes_.clear();
  backend_.reset();
  EXPECT_TRUE(ShellCgroups(options_.cgroup_name).empty());
}

TEST_F(WarmShellTest, StaleShellCgroupsOfDeadDaemonsAreSwept) {
  auto m = jail::CgroupManager::Detect(options_.cgroup_name);
  ASSERT_OK(m);
  // pid 999999999 is above any pid_max: its "daemon" is gone.
  auto stale = (*m)->Create("shell-999999999-0", jail::CgroupLimits{});
  ASSERT_OK(stale);
  ASSERT_OK((*stale)->CreateChild("init"));
  // One of a live daemon (this process) stays.
  auto live = (*m)->Create("shell-" + std::to_string(::getpid()) + "-999", jail::CgroupLimits{});
  ASSERT_OK(live);
  auto b = NewContainerBackend(options_);
  ASSERT_OK(b);
  std::set<std::string> left = ShellCgroups(options_.cgroup_name);
  EXPECT_EQ(left.count("shell-999999999-0"), 0u);
  EXPECT_EQ(left.count("shell-" + std::to_string(::getpid()) + "-999"), 1u);
  EXPECT_OK((*live)->Remove());
}

}  // namespace
}  // namespace warren::runtime

#include "guest/agent/util.h"

#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/unique_fd.h"

extern char** environ;

namespace warren::guest {

uint64_t CodeOf(int err) {
  if (err == ENOENT || err == ENOTDIR) return kNotFound;
  if (err == EACCES || err == EPERM) return kPermissionDenied;
  return kFailedPrecondition;
}

int64_t NowMs() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000 + ts.tv_nsec / 1000000;
}

int64_t NowNs() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

bool WriteFile(const std::string& path, const std::string& data) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bool ok = ::write(fd, data.data(), data.size()) == static_cast<ssize_t>(data.size());
  ::close(fd);
  return ok;
}

std::string ReadFile(const std::string& path, size_t max) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  std::string out;
  if (!fd.valid()) return out;
  char buf[4096];
  while (out.size() < max) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

bool ResolveUser(const std::string& user, uid_t* uid, gid_t* gid, std::string* why) {
  *uid = 0;
  *gid = 0;
  if (user.empty() || user == "root") return true;
  std::string name = user, group;
  size_t colon = user.find(':');
  if (colon != std::string::npos) {
    name = user.substr(0, colon);
    group = user.substr(colon + 1);
  }
  auto number = [](const std::string& s, unsigned long* v) {
    if (s.empty() || s.size() > 10 || s.find_first_not_of("0123456789") != std::string::npos) return false;
    *v = std::strtoul(s.c_str(), nullptr, 10);
    return true;
  };
  unsigned long u = 0, g = 0;
  if (number(name, &u)) {
    g = u;
  } else {
    std::string passwd = ReadFile("/etc/passwd", 1 << 20);
    bool found = false;
    size_t i = 0;
    while (i < passwd.size() && !found) {
      size_t j = passwd.find('\n', i);
      if (j == std::string::npos) j = passwd.size();
      std::string line = passwd.substr(i, j - i);
      i = j + 1;
      std::vector<std::string> f;
      size_t k = 0;
      while (f.size() < 4) {
        size_t c = line.find(':', k);
        f.push_back(line.substr(k, c == std::string::npos ? std::string::npos : c - k));
        if (c == std::string::npos) break;
        k = c + 1;
      }
      if (f.size() >= 4 && f[0] == name && number(f[2], &u) && number(f[3], &g)) found = true;
    }
    if (!found) {
      *why = "user '" + name + "' not found in the sandbox's /etc/passwd";
      return false;
    }
  }
  if (!group.empty() && !number(group, &g)) {
    *why = "bad gid in user '" + user + "'";
    return false;
  }
  *uid = static_cast<uid_t>(u);
  *gid = static_cast<gid_t>(g);
  return true;
}

void SignalCgroup(const std::string& cgroup, int sig) {
  if (sig == SIGKILL && WriteFile(cgroup + "/cgroup.kill", "1")) return;
  std::string procs = ReadFile(cgroup + "/cgroup.procs", 1 << 20);
  size_t i = 0;
  while (i < procs.size()) {
    size_t e = procs.find('\n', i);
    if (e == std::string::npos) e = procs.size();
    pid_t p = static_cast<pid_t>(std::atoi(procs.substr(i, e - i).c_str()));
    if (p > 1) ::kill(p, sig);
    i = e + 1;
  }
}

bool CgroupEmpty(const std::string& cgroup) {
  std::string ev = ReadFile(cgroup + "/cgroup.events", 4096);
  return ev.find("populated 0") != std::string::npos || ev.empty();
}

namespace {
// Why the child could not start, sent over its report pipe before exit.
struct ChildFailure {
  int step;  // 1 cgroup, 2 chdir, 3 user, 4 controlling terminal
  int err;
};
}  // namespace

pid_t Spawn(const SpawnArgs& a, uint64_t* code, int* err_no, std::string* why) {
  int rep[2];
  if (::pipe2(rep, O_CLOEXEC) != 0) {
    *code = kInternal, *err_no = errno, *why = std::string("pipe2: ") + std::strerror(errno);
    return -1;
  }
  UniqueFd rep_r(rep[0]), rep_w(rep[1]);
  pid_t pid = ::fork();
  if (pid < 0) {
    *code = kInternal, *err_no = errno, *why = std::string("fork: ") + std::strerror(errno);
    return -1;
  }
  if (pid == 0) {
    // The agent is single-threaded: the child may allocate.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    ::signal(SIGPIPE, SIG_DFL);
    ::setsid();
    auto fail = [&](int step) {
      ChildFailure cf{step, errno};
      ssize_t ignored = ::write(rep_w.get(), &cf, sizeof cf);
      (void)ignored;
      ::_exit(127);
    };
    if (a.cgroup_procs < 0 || ::write(a.cgroup_procs, "0", 1) != 1) fail(1);
    // fd 3 first: a pipe end numbered 0..2 would be overwritten by dup2.
    int control = a.control >= 0 ? ::fcntl(a.control, F_DUPFD_CLOEXEC, 10) : -1;
    ::dup2(a.in, 0);
    ::dup2(a.out, 1);
    ::dup2(a.err, 2);
    if (control >= 0) ::dup2(control, 3);
    if (a.ctty && ::ioctl(0, TIOCSCTTY, 0) != 0) fail(4);
    if (::chdir(a.cwd) != 0) fail(2);
    if (a.uid != 0 || a.gid != 0) {
      if (::setgroups(0, nullptr) != 0 || ::setgid(a.gid) != 0 || ::setuid(a.uid) != 0) fail(3);
    }
    environ = a.envp;
    ::execvp(a.argv[0], a.argv);
    int e = errno;
    std::string msg = std::string(a.argv[0]) + ": " + (e == ENOENT ? "command not found" : std::strerror(e)) + "\n";
    ssize_t ignored = ::write(2, msg.data(), msg.size());
    (void)ignored;
    ::_exit(e == ENOENT ? 127 : 126);
  }
  rep_w.reset();
  ChildFailure cf{0, 0};
  ssize_t got;
  do {
    got = ::read(rep_r.get(), &cf, sizeof cf);
  } while (got < 0 && errno == EINTR);
  if (got == static_cast<ssize_t>(sizeof cf)) {
    int st;
    ::waitpid(pid, &st, 0);
    const char* step = cf.step == 1   ? "joining the exec cgroup"
                       : cf.step == 2 ? "chdir"
                       : cf.step == 3 ? "setting the user"
                                      : "taking the terminal";
    *code = CodeOf(cf.err);
    *err_no = cf.err;
    *why = std::string("exec: ") + step + (cf.step == 2 ? std::string(" ") + a.cwd : "") + ": " + std::strerror(cf.err);
    return -1;
  }
  return pid;
}

}  // namespace warren::guest

#include "node/suspend_swap.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/swap.h>
#include <sys/sysinfo.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <functional>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/unique_fd.h"

extern char** environ;

namespace warren::node {
namespace {

constexpr int kSwapPriority = 100;
constexpr auto kLockWait = std::chrono::seconds(60);

std::optional<std::string> ReadText(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return std::nullopt;
  std::string out;
  char buf[4096];
  for (int i = 0; i < 256; ++i) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return std::string(absl::StripAsciiWhitespace(out));
}

Status WriteText(const std::string& path, const std::string& v) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoToStatus(errno, "open(" + path + ")");
  if (::write(fd.get(), v.data(), v.size()) != static_cast<ssize_t>(v.size()))
    return ErrnoToStatus(errno, "write(" + path + ", " + v + ")");
  return absl::OkStatus();
}

Status WriteFileAtomic(const std::string& path, const std::string& v) {
  const std::string tmp = path + ".tmp";
  {
    UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!fd.valid()) return ErrnoToStatus(errno, "open(" + tmp + ")");
    if (::write(fd.get(), v.data(), v.size()) != static_cast<ssize_t>(v.size()))
      return ErrnoToStatus(errno, "write(" + tmp + ")");
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) return ErrnoToStatus(errno, "rename(" + tmp + ")");
  return absl::OkStatus();
}

struct ActiveSwap {
  std::string device;
  uint64_t size_bytes;
};

std::vector<ActiveSwap> ReadProcSwaps() {
  std::vector<ActiveSwap> out;
  auto t = ReadText("/proc/swaps");
  if (!t) return out;
  bool header = true;
  for (absl::string_view line : absl::StrSplit(*t, '\n', absl::SkipEmpty())) {
    if (header) {
      header = false;
      continue;
    }
    std::vector<absl::string_view> f = absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    uint64_t kib = 0;
    if (f.size() >= 3 && absl::SimpleAtoi(f[2], &kib)) out.push_back({std::string(f[0]), kib << 10});
  }
  return out;
}

// Runs argv (searched in PATH), output to /dev/null; waits for that pid only.
Status RunTool(const std::vector<std::string>& argv) {
  std::vector<char*> a;
  a.reserve(argv.size() + 1);
  for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
  a.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  int rc = posix_spawnp(&pid, a[0], &fa, nullptr, a.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) return ErrnoToStatus(rc, "posix_spawnp(" + argv[0] + ")");
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return ErrnoToStatus(errno, "waitpid(" + argv[0] + ")");
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::string cmd;
    for (const auto& s : argv) cmd += (cmd.empty() ? "" : " ") + s;
    return absl::InternalError(cmd + " failed (wait status " + std::to_string(status) + ")");
  }
  return absl::OkStatus();
}

uint64_t DefaultZramBytes() {
  struct sysinfo si;
  if (::sysinfo(&si) != 0) return 1ull << 30;
  return static_cast<uint64_t>(si.totalram) * si.mem_unit / 4;
}

// /dev/zramN exists as a block device (devtmpfs may be absent in a container).
Status EnsureDevNode(const std::string& sysfs, int n) {
  const std::string dev = "/dev/zram" + std::to_string(n);
  struct stat st;
  if (::stat(dev.c_str(), &st) == 0 && S_ISBLK(st.st_mode)) return absl::OkStatus();
  auto mm = ReadText(sysfs + "/block/zram" + std::to_string(n) + "/dev");
  std::vector<std::string> parts = mm ? absl::StrSplit(*mm, ':') : std::vector<std::string>{};
  unsigned maj = 0, min = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &maj) || !absl::SimpleAtoi(parts[1], &min))
    return absl::NotFoundError("no major:minor for zram" + std::to_string(n));
  if (::mknod(dev.c_str(), S_IFBLK | 0600, makedev(maj, min)) != 0 && errno != EEXIST)
    return ErrnoToStatus(errno, "mknod(" + dev + ")");
  return absl::OkStatus();
}

}  // namespace

StatusOr<SuspendSwap> EnsureSuspendSwap(const SuspendSwapOptions& o) {
  SuspendSwap out;
  if (o.mode == "none") {
    out.how = "disabled";
    return out;
  }
  if (o.mode != "auto") return absl::InvalidArgumentError("--suspend-swap=" + o.mode + ": must be auto or none");
  if (::mkdir(o.run_dir.c_str(), 0755) != 0 && errno != EEXIST) return ErrnoToStatus(errno, "mkdir(" + o.run_dir + ")");
  const std::string lock_path = o.run_dir + "/suspend-swap.lock", marker = o.run_dir + "/suspend-swap";
  UniqueFd lock(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!lock.valid()) return ErrnoToStatus(errno, "open(" + lock_path + ")");
  const auto deadline = std::chrono::steady_clock::now() + kLockWait;
  while (::flock(lock.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK && errno != EINTR) return ErrnoToStatus(errno, "flock(" + lock_path + ")");
    if (std::chrono::steady_clock::now() > deadline)
      return absl::DeadlineExceededError("flock(" + lock_path + ") held for 60 s");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const std::string ours = ReadText(marker).value_or("");
  std::vector<ActiveSwap> active = ReadProcSwaps();
  if (!active.empty()) {
    out.how = "host";
    out.device = active[0].device;
    for (const auto& a : active) {
      out.size_bytes += a.size_bytes;
      if (!ours.empty() && a.device == ours) {
        out.how = "adopted";
        out.device = ours;
      }
    }
    return out;
  }

  // No swap at all: pick a zram device.
  const std::string ctl = o.sysfs + "/class/zram-control";
  int n = -1;
  bool hot_added = false;
  if (ours.rfind("/dev/zram", 0) == 0) {
    int k = -1;
    if (absl::SimpleAtoi(ours.substr(9), &k) && ReadText(o.sysfs + "/block/zram" + std::to_string(k) + "/initstate")) {
      // Ours from a set-up that did not finish (or a swapoff by hand): start over.
      (void)WriteText(o.sysfs + "/block/zram" + std::to_string(k) + "/reset", "1");
      if (ReadText(o.sysfs + "/block/zram" + std::to_string(k) + "/initstate").value_or("1") == "0") n = k;
    }
  }
  if (n < 0 && ReadText(o.sysfs + "/block/zram0/initstate").value_or("") == "0") n = 0;
  if (n < 0) {
    auto added = ReadText(ctl + "/hot_add");
    if (!added || !absl::SimpleAtoi(*added, &n)) {
      return absl::FailedPreconditionError("no unused zram device and " + ctl +
                                           "/hot_add failed (is the zram module loaded?)");
    }
    hot_added = true;
  }
  const std::string name = "zram" + std::to_string(n), blk = o.sysfs + "/block/" + name, dev = "/dev/" + name;
  bool ok = false;
  struct Undo {
    std::function<void()> f;
    ~Undo() { f(); }
  } undo{[&] {
    if (ok) return;
    (void)::swapoff(dev.c_str());
    (void)WriteText(blk + "/reset", "1");
    if (hot_added) (void)WriteText(ctl + "/hot_remove", std::to_string(n));
    (void)::unlink(marker.c_str());
  }};
  RETURN_IF_ERROR(WriteFileAtomic(marker, dev));
  if (auto algs = ReadText(blk + "/comp_algorithm"); algs && algs->find("lz4") != std::string::npos) {
    (void)WriteText(blk + "/comp_algorithm", "lz4");  // fast; otherwise the default (lzo-rle)
  }
  const uint64_t bytes = o.zram_size_mb ? o.zram_size_mb << 20 : DefaultZramBytes();
  RETURN_IF_ERROR(WriteText(blk + "/disksize", std::to_string(bytes)));
  RETURN_IF_ERROR(EnsureDevNode(o.sysfs, n));
  RETURN_IF_ERROR(RunTool({"mkswap", dev}));
  if (::swapon(dev.c_str(), SWAP_FLAG_PREFER | ((kSwapPriority << SWAP_FLAG_PRIO_SHIFT) & SWAP_FLAG_PRIO_MASK)) != 0)
    return ErrnoToStatus(errno, "swapon(" + dev + ")");
  ok = true;
  out.how = "created";
  out.device = dev;
  out.size_bytes = bytes;
  return out;
}

}  // namespace warren::node

#include "jail/seccomp.h"

#include <linux/seccomp.h>
#include <seccomp.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "common/unique_fd.h"

// Generated at build time from src/jail/seccomp/default.json by
// src/jail/seccomp/embed.cmake.
extern "C" const char warren_default_seccomp_json[];
extern "C" const unsigned long warren_default_seccomp_json_size;

namespace warren::jail {
namespace {

using json = nlohmann::json;

struct CtxDeleter {
  void operator()(void* ctx) const { seccomp_release(ctx); }
};
using ScmpCtx = std::unique_ptr<void, CtxDeleter>;

Status Invalid(const std::string& what) { return absl::InvalidArgumentError("seccomp profile: " + what); }

// libseccomp returns -errno.
Status ScmpError(int rc, const std::string& what) { return ErrnoToStatus(-rc, what); }

std::optional<int> ErrnoByName(const std::string& name) {
  static constexpr struct {
    const char* name;
    int value;
  } kErrnos[] = {
      {"EPERM", EPERM},
      {"ENOENT", ENOENT},
      {"EIO", EIO},
      {"ENXIO", ENXIO},
      {"EACCES", EACCES},
      {"ENODEV", ENODEV},
      {"EINVAL", EINVAL},
      {"ENOTTY", ENOTTY},
      {"ENOSYS", ENOSYS},
      {"EOPNOTSUPP", EOPNOTSUPP},
      {"ENOTSUP", ENOTSUP},
      {"EAFNOSUPPORT", EAFNOSUPPORT},
      {"EPROTONOSUPPORT", EPROTONOSUPPORT},
  };
  for (const auto& e : kErrnos) {
    if (name == e.name) return e.value;
  }
  char* end = nullptr;
  errno = 0;
  long v = std::strtol(name.c_str(), &end, 10);
  if (!name.empty() && errno == 0 && *end == '\0' && v > 0 && v < 4096) return static_cast<int>(v);
  return std::nullopt;
}

StatusOr<uint32_t> ParseAction(const json& j, const std::string& where) {
  if (!j.is_string()) return Invalid(where + ": action must be a string");
  const std::string a = j.get<std::string>();
  if (a == "allow") return SCMP_ACT_ALLOW;
  if (a == "kill_process") return SCMP_ACT_KILL_PROCESS;
  if (a == "kill_thread" || a == "kill") return SCMP_ACT_KILL_THREAD;
  if (a == "trap") return SCMP_ACT_TRAP;
  if (a == "log") return SCMP_ACT_LOG;
  if (a.rfind("errno:", 0) == 0) {
    std::optional<int> e = ErrnoByName(a.substr(6));
    if (!e) return Invalid(where + ": unknown errno in action \"" + a + "\"");
    return SCMP_ACT_ERRNO(static_cast<uint32_t>(*e));
  }
  return Invalid(where + ": unknown action \"" + a + "\"");
}

StatusOr<uint64_t> ParseU64(const json& j, const std::string& where) {
  if (j.is_number_unsigned()) return j.get<uint64_t>();
  if (j.is_number_integer() && j.get<int64_t>() >= 0) return static_cast<uint64_t>(j.get<int64_t>());
  if (j.is_string()) {
    const std::string s = j.get<std::string>();
    char* end = nullptr;
    errno = 0;
    unsigned long long v = std::strtoull(s.c_str(), &end, 0);
    if (!s.empty() && s[0] != '-' && errno == 0 && *end == '\0') return static_cast<uint64_t>(v);
  }
  return Invalid(where + ": expected a non-negative number or a numeric string, got " + j.dump());
}

StatusOr<scmp_arg_cmp> ParseArg(const json& j, const std::string& where) {
  if (!j.is_object()) return Invalid(where + ": argument filter must be an object");
  if (!j.contains("index") || !j["index"].is_number_integer() || j["index"].get<int>() < 0 ||
      j["index"].get<int>() > 5) {
    return Invalid(where + ": argument filter needs \"index\" in 0..5");
  }
  if (!j.contains("op") || !j["op"].is_string()) return Invalid(where + ": argument filter needs \"op\"");
  if (!j.contains("value")) return Invalid(where + ": argument filter needs \"value\"");
  scmp_arg_cmp cmp{};
  cmp.arg = static_cast<unsigned int>(j["index"].get<int>());
  const std::string op = j["op"].get<std::string>();
  static constexpr struct {
    const char* name;
    scmp_compare op;
  } kOps[] = {{"eq", SCMP_CMP_EQ},
              {"ne", SCMP_CMP_NE},
              {"lt", SCMP_CMP_LT},
              {"le", SCMP_CMP_LE},
              {"gt", SCMP_CMP_GT},
              {"ge", SCMP_CMP_GE},
              {"masked_eq", SCMP_CMP_MASKED_EQ}};
  bool found = false;
  for (const auto& o : kOps) {
    if (op == o.name) {
      cmp.op = o.op;
      found = true;
    }
  }
  if (!found) return Invalid(where + ": unknown argument op \"" + op + "\"");
  ASSIGN_OR_RETURN(uint64_t value, ParseU64(j["value"], where));
  if (cmp.op == SCMP_CMP_MASKED_EQ) {
    if (!j.contains("mask")) return Invalid(where + ": masked_eq needs \"mask\"");
    ASSIGN_OR_RETURN(uint64_t mask, ParseU64(j["mask"], where));
    cmp.datum_a = mask;
    cmp.datum_b = value;
  } else {
    if (j.contains("mask")) return Invalid(where + ": \"mask\" is only valid with op masked_eq");
    cmp.datum_a = value;
  }
  return cmp;
}

constexpr const char* kArchNames[] = {"x86_64",  "x86",     "x32",   "aarch64", "arm",
                                      "riscv64", "ppc64le", "s390x", "mips64",  "loongarch64"};

std::string NativeArchName() {
  const uint32_t native = seccomp_arch_native();
  for (const char* name : kArchNames) {
    if (seccomp_arch_resolve_name(name) == native) return name;
  }
  return "";
}

// Adds the extra ABIs listed for the native arch (profile "architectures").
Status AddArchitectures(void* ctx, const json& profile) {
  if (!profile.contains("architectures")) return absl::OkStatus();
  const json& archs = profile["architectures"];
  if (!archs.is_object()) return Invalid("\"architectures\" must be an object {native: [extra, ...]}");
  const std::string native = NativeArchName();
  if (native.empty() || !archs.contains(native)) return absl::OkStatus();
  if (!archs[native].is_array()) return Invalid("architectures." + native + " must be an array");
  for (const json& a : archs[native]) {
    if (!a.is_string()) return Invalid("architectures." + native + ": names must be strings");
    const std::string name = a.get<std::string>();
    const uint32_t token = seccomp_arch_resolve_name(name.c_str());
    if (token == 0) return Invalid("unknown architecture \"" + name + "\"");
    int rc = seccomp_arch_add(ctx, token);
    if (rc != 0 && rc != -EEXIST) return ScmpError(rc, "seccomp_arch_add(" + name + ")");
  }
  return absl::OkStatus();
}

Status AddRule(void* ctx, const json& rule, size_t index, uint32_t default_action) {
  std::string where = "rules[" + std::to_string(index) + "]";
  if (!rule.is_object()) return Invalid(where + " must be an object");
  if (!rule.contains("names") || !rule["names"].is_array() || rule["names"].empty()) {
    return Invalid(where + ": \"names\" must be a non-empty array of syscall names");
  }
  if (!rule.contains("action")) return Invalid(where + ": missing \"action\"");
  ASSIGN_OR_RETURN(uint32_t action, ParseAction(rule["action"], where));
  if (action == default_action) {
    return Invalid(where + ": action equals default_action (the rule would do nothing)");
  }
  std::vector<scmp_arg_cmp> args;
  if (rule.contains("args")) {
    if (!rule["args"].is_array()) return Invalid(where + ": \"args\" must be an array");
    for (const json& a : rule["args"]) {
      ASSIGN_OR_RETURN(scmp_arg_cmp cmp, ParseArg(a, where));
      args.push_back(cmp);
    }
  }
  for (const json& n : rule["names"]) {
    if (!n.is_string()) return Invalid(where + ": syscall names must be strings");
    const std::string name = n.get<std::string>();
    // Negative pseudo numbers (< __NR_SCMP_ERROR) name syscalls that exist only
    // on some of the filter's ABIs; libseccomp applies them where they exist.
    const int nr = seccomp_syscall_resolve_name(name.c_str());
    if (nr == __NR_SCMP_ERROR) return Invalid(where + ": unknown syscall \"" + name + "\"");
    int rc = seccomp_rule_add_array(ctx, action, nr, static_cast<unsigned int>(args.size()),
                                    args.empty() ? nullptr : args.data());
    if (rc != 0) {
      return Invalid(where + ": cannot add rule for syscall \"" + name + "\": " + std::strerror(-rc));
    }
  }
  return absl::OkStatus();
}

StatusOr<SeccompProgram> ExportBpf(void* ctx) {
  UniqueFd fd(memfd_create("warren-seccomp-bpf", MFD_CLOEXEC));
  if (!fd.valid()) return ErrnoToStatus(errno, "memfd_create(warren-seccomp-bpf)");
  int rc = seccomp_export_bpf(ctx, fd.get());
  if (rc != 0) return ScmpError(rc, "seccomp_export_bpf");
  off_t size = lseek(fd.get(), 0, SEEK_END);
  if (size < 0) return ErrnoToStatus(errno, "lseek(seccomp bpf memfd)");
  if (size == 0 || size % sizeof(sock_filter) != 0 || size / sizeof(sock_filter) > BPF_MAXINSNS) {
    return absl::InternalError("seccomp_export_bpf produced " + std::to_string(size) +
                               " bytes, not a valid program of at most " + std::to_string(BPF_MAXINSNS) +
                               " instructions");
  }
  SeccompProgram program;
  program.filter.resize(static_cast<size_t>(size) / sizeof(sock_filter));
  char* buf = reinterpret_cast<char*>(program.filter.data());
  size_t done = 0;
  while (done < static_cast<size_t>(size)) {
    ssize_t n = pread(fd.get(), buf + done, static_cast<size_t>(size) - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoToStatus(errno, "pread(seccomp bpf memfd)");
    if (n == 0) return absl::InternalError("seccomp bpf memfd shrank while reading");
    done += static_cast<size_t>(n);
  }
  return program;
}

StatusOr<SeccompProgram> Compile(const json& profile, bool binary_tree) {
  if (!profile.is_object()) return Invalid("top level must be an object");
  uint32_t default_action = SCMP_ACT_ALLOW;
  if (profile.contains("default_action")) {
    ASSIGN_OR_RETURN(default_action, ParseAction(profile["default_action"], "default_action"));
  }
  ScmpCtx ctx(seccomp_init(default_action));
  if (!ctx) return absl::InternalError("seccomp_init failed");
  uint32_t bad_arch = SCMP_ACT_KILL_PROCESS;
  if (profile.contains("bad_arch_action")) {
    ASSIGN_OR_RETURN(bad_arch, ParseAction(profile["bad_arch_action"], "bad_arch_action"));
  }
  int rc = seccomp_attr_set(ctx.get(), SCMP_FLTATR_ACT_BADARCH, bad_arch);
  if (rc != 0) return ScmpError(rc, "seccomp_attr_set(SCMP_FLTATR_ACT_BADARCH)");
  RETURN_IF_ERROR(AddArchitectures(ctx.get(), profile));
  if (binary_tree) {
    rc = seccomp_attr_set(ctx.get(), SCMP_FLTATR_CTL_OPTIMIZE, 2);
    if (rc != 0) return ScmpError(rc, "seccomp_attr_set(SCMP_FLTATR_CTL_OPTIMIZE, 2)");
  }
  if (!profile.contains("rules") || !profile["rules"].is_array()) {
    return Invalid("\"rules\" must be an array");
  }
  size_t i = 0;
  for (const json& rule : profile["rules"]) {
    RETURN_IF_ERROR(AddRule(ctx.get(), rule, i++, default_action));
  }
  return ExportBpf(ctx.get());
}

}  // namespace

const std::string& DefaultSeccompProfile() {
  static const std::string* const kProfile =
      new std::string(warren_default_seccomp_json, warren_default_seccomp_json_size);
  return *kProfile;
}

StatusOr<SeccompProgram> CompileSeccompProfile(const std::string& json_text, bool binary_tree) {
  json profile = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (profile.is_discarded()) return Invalid("not valid JSON");
  // The checks above make type errors unreachable; the catch keeps a missed
  // one from crossing the module boundary as an exception.
  try {
    return Compile(profile, binary_tree);
  } catch (const json::exception& e) {
    return Invalid(e.what());
  }
}

int InstallSeccompProgram(const sock_fprog* prog) {
  if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, prog) == 0) return 0;
  if (errno != ENOSYS) return -errno;
  if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, prog, 0, 0) == 0) return 0;
  return -errno;
}

}  // namespace warren::jail

// Warm starts of microVMs by cloning a saved template (QEMU 7.2; the recipe
// and its pitfalls: bench/microvm/README.md).
//
// A template is a guest booted once per (kernel + initramfs + QEMU + its
// arguments, layer count, memory size, vCPUs, accelerator) with the kernel
// argument warren.template=1: its agent loads every module (the disk driver
// probes the template's placeholder disks, sparse files of
// kTemplateDiskBytes) and waits, without a root, without having opened a
// disk or read boot_id. It is then
// saved with QMP `migrate` to a state file, with x-ignore-shared: its RAM is
// not in the stream but stays in a memfd (mapped share=on by the template
// QEMU), sealed against writes and resizes once the template QEMU is gone.
//
// A clone is QEMU started with the same devices in the same order
// (QemuArgv), its own layer and writable disk files behind them (the guest
// keeps the capacity it probed in the template: a clone's files must not be
// larger, FitsTemplate; EROFS and ext4 never read past their own size, so a
// smaller file behind a larger device is fine), the memfd
// mapped share=off (MAP_PRIVATE: the template's pages are shared through the
// page cache, a clone's writes are its own) and `-incoming defer`; the
// state file goes in over QMP (getfd + migrate-incoming fd:). On restore the
// guest runs where the template stopped; the host's first hello then gives
// the agent the time, a fresh RNG seed (credited, with a forced reseed), the
// hostname and the root to mount (protocol.h).
//
// Why a memfd and not a file: QEMU 7.2 opens mem-path O_RDWR even with
// share=off, so a clone QEMU could write(2) a template file under all other
// clones; a sealed memfd refuses writes and shared writable mappings. The
// price: the memfd lives with the daemon (and the clones mapping it): a
// restarted daemon builds its templates anew.
//
// A template WITH ITS ROOT (GetRooted) is one more step per layer set and
// disk size: a clone of the bare template above, restored into a copy of
// its RAM (a fresh memfd, mapped share=on), given that layer set and a
// fresh writable disk, told to mount its root (hello template_root: the
// agent mounts EROFS, ext4 and the overlay but still does not read
// boot_id), made to run one command (`/bin/sh -c 'exec /usr/bin/env
// true'`: the loader, libc, the shell and the PATH walk are then in the
// guest's page cache), then saved the same way. Its writable disk is kept
// beside its state: a clone gets a sparse copy of it (CopyDisk), so the
// guest's cached view of the ext4 and the clone's disk agree, and the
// clone's agent only sets its identity (hostname, /dev/shm size, task
// limit) after the clock and the RNG. Kept per (bare template, layer
// files, disk_mb); a layer file whose identity (device, inode, size,
// mtime) changed rebuilds it; at most kMaxRootedTemplateMb of guest RAM in
// such templates, the least recently used dropped beyond that.
//
// Files: <dir>/<key>/ holds a template's state file (after a build) and,
// while it builds, its placeholders, sockets and logs. A template whose
// inputs changed (Get with other inputs) or the cache's destruction removes
// its dir; the memfd goes when its last user does.
//
// Concurrency: one build per template at a time; creates wanting the same
// template wait for that build (an in-process mutex: nothing on disk to
// leave behind). A failed build is remembered with its reason for those
// inputs (no rebuild loop); callers fall back to a cold boot.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"
#include "runtime/microvm/qemu.h"

namespace warren::runtime::microvm {

// The size of a template's placeholder disks, i.e. the capacity every
// clone's guest sees for its layers and writable disk (1 TiB: sparse
// files, never written).
inline constexpr uint64_t kTemplateDiskBytes = uint64_t{1} << 40;

// Whether a VM with these layer files and a writable disk of `disk_mb` MiB
// can be a clone: no file larger than kTemplateDiskBytes. A layer file
// that cannot be stat'ed does not fit (the create reports it).
bool FitsTemplate(const std::vector<std::string>& layer_files, uint64_t disk_mb);

// Guest RAM held by templates with their root, at most (the least
// recently used go beyond it; one is always kept).
inline constexpr uint64_t kMaxRootedTemplateMb = 2048;

// A saved template: what a clone needs.
struct Template {
  std::string dir;
  std::string state_file;
  UniqueFd ram;  // the sealed memfd
  uint32_t memory_mb = 0;
  // A template with its root (GetRooted): its writable disk as it was
  // when saved (a clone's disk is a copy of it); empty for a bare one.
  std::string disk;
  ~Template();  // removes dir
};

struct TemplateOptions {
  std::string qemu, kernel, initrd;
  std::string dir;  // parent of the templates' dirs (created if missing)
  std::chrono::milliseconds boot_timeout{60000};
  QemuIdentity identity;  // the template QEMU's uid/gid
};

class TemplateCache {
 public:
  explicit TemplateCache(TemplateOptions o) : o_(std::move(o)) {}
  ~TemplateCache();  // removes every template's dir

  // The template for VMs like `vm` (its layer count, memory, vCPUs,
  // accelerator; the disks and console are ignored), built now if there is
  // none for the current inputs. An error says why none can be had.
  StatusOr<std::shared_ptr<const Template>> Get(const VmConfig& vm);

  // The template with its root mounted for VMs like `vm` with exactly its
  // layer files and a writable disk of `disk_mb` MiB, built now (from the
  // bare template of Get, ~1 s under TCG) if there is none for the
  // current inputs. An error says why none can be had (the caller then
  // clones the bare template).
  StatusOr<std::shared_ptr<const Template>> GetRooted(const VmConfig& vm, uint32_t disk_mb);

 private:
  struct Entry {
    std::mutex build;  // held while building
    std::shared_ptr<const Template> ready;
    std::string failed;  // why the build failed, for these inputs
    // Templates with their root: the layer files' identities it was built
    // from, its RAM, when it was last handed out (an ever-growing count).
    std::string layer_inputs;
    uint32_t memory_mb = 0;
    uint64_t last_used = 0;
  };
  // The bare template's name for `vm`; mu_ held.
  StatusOr<std::string> BareName(const VmConfig& vm);
  StatusOr<std::shared_ptr<const Template>> Build(const VmConfig& vm, const std::string& name);
  StatusOr<std::shared_ptr<const Template>> BuildRooted(const VmConfig& vm, uint32_t disk_mb, const Template& bare,
                                                        const std::string& name);
  // Drops the least recently used templates with their root beyond
  // kMaxRootedTemplateMb, sparing `keep`; mu_ held.
  void EvictRooted(const std::string& keep);
  // Hash of the kernel, initramfs and QEMU binary (content of the first
  // two, identity and size of the third), cached by their stat identity.
  StatusOr<std::string> InputsHash();

  const TemplateOptions o_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<Entry>> entries_;  // by name (inputs + shape)
  std::string stat_key_, inputs_hash_;
  uint64_t uses_ = 0;
};

// Restores a clone in the QEMU that listens for QMP on `qmp_path` (started
// with the clone's VmConfig): capabilities, x-ignore-shared, the state file
// passed as an fd, migrate-incoming; then QEMU's status is polled: OK once
// the guest runs.
Status RestoreClone(const std::string& qmp_path, const Template& t, std::chrono::steady_clock::time_point deadline);

// Kills the QEMUs (`qemu` binary) whose arguments name `dir` (a template's
// -name is "warren-template:<its dir>"):
// template builds a killed daemon left running (a template QEMU lives only
// while its template is saved, outside any sandbox's cgroup). Returns how
// many were killed.
int KillTemplateQemus(const std::string& qemu, const std::string& dir);

// A unix socket listening at `path` (QEMU is given it as an fd).
StatusOr<UniqueFd> ListenUnix(const std::string& path);

}  // namespace warren::runtime::microvm

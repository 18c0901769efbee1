// Warm starts of desktop VMs (vm_backend.h): a template per (guest files,
// QEMU, memory size, screen size, vCPUs, accelerator, layer set: the root
// is mounted at boot) is booted once, left
// until its desktop takes input, and saved; every later create restores a
// clone of it instead of booting. The mechanism is the microvm backend's
// (runtime/microvm/template.h, QEMU 7.2's x-ignore-shared): the template's
// RAM is a memfd QEMU maps share=on, left out of the migration stream and
// sealed once the template QEMU is gone; a clone maps it share=off
// (MAP_PRIVATE: the template's pages shared through the page cache, its
// writes its own) and loads the stream (device state, the display's video
// RAM) with `-incoming defer`. What differs from a microvm template:
// * The guest booted fully (systemd, X, the window manager, xterm): there
//   is no root left for the clone to set up; the template is saved once X
//   takes keyboard input (WaitForDesktop), so a clone's first screenshot is
//   the desktop and its first keys reach xterm.
// * The disk: the template's guest wrote to its qcow2 overlay of upper.img
//   (its root's upper dir) while booting, and its page cache and mounted ext4 match that overlay
//   at the instant of the save. The overlay (Template::disk) is kept,
//   read-only, and each clone starts from a copy of it (CopyDisk: FICLONE
//   where the file system shares extents, else copy_file_range; a few MiB
//   of qcow2 clusters), its own overlay of upper.img from then on; its
//   layer disks are the same files, read-only. A clone's
//   disk thus never depends on the template's files: suspend, adoption
//   after a daemon restart and cleanup treat it as a cold-booted VM's.
// * On restore the host's first hello sets the guest's clock and mixes a
//   fresh seed into its RNG with a forced reseed (as a microvm clone's);
//   clones share the template's boot_id and machine-id.
//
// Files: <dir>/<name>/ with state (the device state) and disk.qcow2 once
// saved; while it builds also its sockets, console.log and qemu.log. A
// template whose inputs changed (the guest's system.erofs, upper.img,
// vmlinuz or initrd.img, or QEMU, replaced: their stat identity) is dropped at the next
// Get; its dir goes with its last user (a clone being created holds it).
// The cache's destruction removes them all; a restarted daemon empties
// <dir> (its memfds died with it) and kills build QEMUs it left.
//
// Concurrency: one build per name at a time; creates wanting it wait. A
// build that failed other than by a timeout is remembered with its reason
// (no rebuild loop): creates boot cold. One that timed out fails the create
// that waited for it (a cold boot would not fare better) and is tried again
// by the next.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"
#include "runtime/microvm/channel.h"
#include "runtime/vm/qmp.h"

namespace warren::runtime::vm {

struct Template {
  std::string dir;
  std::string state_file;  // <dir>/state
  std::string disk;        // <dir>/disk.qcow2: the overlay as the save left it
  UniqueFd ram;            // the sealed memfd, memory_mb MiB
  uint32_t memory_mb = 0;
  ~Template();  // removes dir
};

class TemplateCache {
 public:
  // Builds the template into `dir` (created, empty); returns it saved.
  using Builder = std::function<StatusOr<std::shared_ptr<Template>>(const std::string& dir)>;

  // `inputs`: the files whose identity (device, inode, size, mtime) keys
  // every template (the guest's files and QEMU).
  TemplateCache(std::string dir, std::vector<std::string> inputs);
  ~TemplateCache();  // removes every template's dir

  // The template for `shape` (what of the VM's command line a clone must
  // share with it, e.g. "m1024-s1024x768-c1-tcg"), built with `build` now
  // if there is none for the current inputs. An error says why none can be
  // had: the build's DeadlineExceeded as it is (the guest did not answer or
  // its desktop did not come up in time; not remembered: the next Get
  // builds again), FailedPrecondition naming the reason for any other
  // failure (remembered for these inputs).
  StatusOr<std::shared_ptr<const Template>> Get(const std::string& shape, const Builder& build);

 private:
  struct Entry {
    std::mutex build;
    std::shared_ptr<const Template> ready;
    std::string failed;
  };
  const std::string dir_;
  const std::vector<std::string> inputs_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<Entry>> entries_;
};

// Copies the file `from` to `to` (created 0600, must not exist): FICLONE
// (shared extents) where the file system can, else copy_file_range. On
// error `to` is removed.
Status CopyDisk(const std::string& from, const std::string& to);

// Waits, until `deadline`, for the desktop of the booted guest behind `ch`
// and `qmp` to take keyboard input: X's socket and xterm's process exist
// (asked over the agent), then a typed command (` touch <marker>`) runs in
// xterm's shell (its window is mapped, focused and read), then the screen
// is cleared (ctrl+l) and settles (two equal screenshots 500 ms apart).
// DeadlineExceeded naming the step it waited for.
Status WaitForDesktop(microvm::AgentChannel& ch, QmpClient& qmp, std::chrono::steady_clock::time_point deadline);

}  // namespace warren::runtime::vm

// Prefetch of a suspended sandbox's working set (suspend/resume):
// after the memory cgroup was reclaimed into swap/zram, bring pages back
// before the sandbox runs again so that its first steps do not fault on
// every page.
//
// Both functions are best effort: a process or file that vanished or refuses
// the hint is skipped. Call them with the sandbox frozen (nothing maps,
// unmaps or replaces files meanwhile). Thread-safe (no shared state).
#pragma once

#include <sys/types.h>

#include <cstdint>

namespace warren::runtime {

// process_madvise(MADV_WILLNEED) over every mapping of `pid` (read from
// /proc/<pid>/maps): anonymous pages are read back from swap into the swap
// cache, file (EROFS, tmpfs) pages into the page cache. Needs CAP_SYS_NICE
// and ptrace-read access to `pid`. Returns the bytes advised.
uint64_t PrefetchMappings(pid_t pid);

// Reads the regular files under the directory `dir_fd` (the sandbox's tmpfs
// upper; not followed: symlinks, devices, fifos are skipped) until `budget`
// bytes were read, so that tmpfs pages in swap come back. Depth at most 64,
// at most 1,000,000 entries. Returns the bytes read.
uint64_t PrefetchFiles(int dir_fd, uint64_t budget);

}  // namespace warren::runtime

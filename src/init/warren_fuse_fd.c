// warren-fuse-fd: holds the FUSE connection of warrend's layer read cache
// (src/image/blob_fs.h) so that it outlives the daemon. EROFS layers of
// running sandboxes are mounted from that FUSE file system's files; the
// kernel aborts a FUSE connection when the last fd of its /dev/fuse file is
// closed, which would break every such layer when warrend dies. This process
// keeps one: while no daemon serves the connection, the kernel queues the
// layers' reads, and a restarted warrend takes the fd back with
// pidfd_getfd(2) (found by its argv: "warren-fuse-fd MOUNTPOINT"), has the
// kernel re-queue the requests the dead daemon had read but not answered
// (FUSE_NOTIFY_RESEND, Linux 6.9) and serves on.
//
// Contract: started by warrend with the connection's /dev/fuse fd as fd 3
// and nothing else open (stdin/stdout/stderr may be /dev/null). Reads
// nothing from the device. Exits by itself when the connection ends (the
// file system unmounted or aborted: poll reports POLLERR); warrend kills it
// (SIGKILL through a pidfd) when it unmounts the file system itself.
// Ignores SIGINT/SIGTERM/SIGHUP/SIGQUIT and leaves the daemon's session, so
// a signal to the daemon's process group or terminal does not end it.
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

int main(int argc, char** argv) {
  (void)argv;
  if (argc != 2) return 2;
  (void)setsid();
  const int ignored[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE};
  for (unsigned i = 0; i < sizeof ignored / sizeof ignored[0]; ++i) (void)signal(ignored[i], SIG_IGN);
  if (chdir("/") != 0) return 1;
  for (;;) {
    // No events asked: /dev/fuse reports POLLOUT always and POLLIN for a
    // queued request, neither of which is ours; POLLERR (always reported)
    // when the connection is gone.
    struct pollfd p = {3, 0, 0};
    if (poll(&p, 1, -1) < 0) {
      if (errno == EINTR) continue;
      return 1;
    }
    if ((p.revents & (POLLERR | POLLHUP | POLLNVAL)) != 0) return 0;
  }
}

// erofs_mount IMAGE DIR: mounts an EROFS image file read-only on DIR,
// file-backed (no loop device) through the new mount API, the way warren's
// layer store mounts layers. Unmount with umount(8).
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/mount.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s IMAGE DIR\n", argv[0]);
    return 2;
  }
  int fs = (int)syscall(SYS_fsopen, "erofs", FSOPEN_CLOEXEC);
  if (fs < 0) {
    fprintf(stderr, "erofs_mount: fsopen(erofs): %s\n", strerror(errno));
    return 1;
  }
  if (syscall(SYS_fsconfig, fs, FSCONFIG_SET_STRING, "source", argv[1], 0) != 0) {
    fprintf(stderr, "erofs_mount: fsconfig(source=%s): %s\n", argv[1], strerror(errno));
    return 1;
  }
  if (syscall(SYS_fsconfig, fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) != 0) {
    fprintf(stderr, "erofs_mount: fsconfig(%s, create): %s\n", argv[1], strerror(errno));
    return 1;
  }
  int mnt = (int)syscall(SYS_fsmount, fs, FSMOUNT_CLOEXEC, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NODEV);
  if (mnt < 0) {
    fprintf(stderr, "erofs_mount: fsmount(%s): %s\n", argv[1], strerror(errno));
    return 1;
  }
  if (syscall(SYS_move_mount, mnt, "", AT_FDCWD, argv[2], MOVE_MOUNT_F_EMPTY_PATH) != 0) {
    fprintf(stderr, "erofs_mount: move_mount(%s -> %s): %s\n", argv[1], argv[2], strerror(errno));
    return 1;
  }
  return 0;
}

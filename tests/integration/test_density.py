"""Density layout of a container sandbox (issue 3, container_backend.h):
each superblock a sandbox holds makes every memory cgroup on the host bigger,
so a sandbox owns only 6 (overlay, upper tmpfs which also holds /dev, proc,
devpts, /dev/shm, mqueue) plus, where the sandbox's cgroup is shown at
/sys/fs/cgroup, the small tmpfs holding that view's mount points; the masked
dirs and /sys are clones of two backend-wide read-only mounts. Sharing them must not open a channel between
sandboxes: both are read-only at the superblock and not remountable inside."""


def _mounts(sb):
    """[(device, mount point, fstype)] of the sandbox's mount namespace."""
    r = sb.exec(["cat", "/proc/self/mountinfo"], timeout=30)
    assert r.exit_code == 0, r.stderr
    out = []
    for line in r.stdout.decode().splitlines():
        f = line.split()
        sep = f.index("-")
        out.append((f[2], f[4], f[sep + 1]))
    return out


def test_sandbox_owns_six_superblocks_and_shares_only_read_only_ones(client, base_layer):
    with client.create(layers=[base_layer]) as a, client.create(layers=[base_layer]) as b:
        ma, mb = _mounts(a), _mounts(b)
        devs_b = {d for d, _, _ in mb}
        own = {d for d, _, t in ma if d not in devs_b and t != "devtmpfs"}
        shared = {(mp, t) for d, mp, t in ma if d in devs_b and t != "devtmpfs"}
        # overlay /, tmpfs /dev (the upper's tmpfs), proc, devpts, /dev/shm, mqueue,
        # and the tmpfs of the cgroup view at /sys/fs/cgroup when there is one
        cgview = {d for d, mp, t in ma if mp == "/sys/fs/cgroup" and t == "tmpfs"}
        assert len(cgview) <= 1, ma
        assert len(own - cgview) == 6, ma
        assert {t for d, _, t in ma if d in own} == {"overlay", "tmpfs", "proc", "devpts", "mqueue"}, ma
        assert ("/sys", "sysfs") in shared and ("/proc/acpi", "tmpfs") in shared, shared
        # plus, where present, the limit views: lxcfs's read-only per-reader
        # files and the read-only binds of the sandbox's own cgroup dirs
        assert {t for _, t in shared} - {"fuse.lxcfs", "cgroup"} == {"sysfs", "tmpfs"}, shared


def test_shared_mounts_stay_read_only_inside(sandbox):
    r = sandbox.exec("touch /proc/acpi/x; mount -o remount,rw /proc/acpi; mount -o remount,bind,rw /proc/acpi;"
                     " touch /proc/acpi/x; mount -o remount,rw /sys; echo > /sys/kernel/uevent_helper;"
                     " ls -A /proc/acpi /sys/firmware; echo end", timeout=30)
    assert r.stdout == b"/proc/acpi:\n\n/sys/firmware:\nend\n", (r.stdout, r.stderr)
    assert r.stderr.count(b"Read-only file system") >= 3, r.stderr
    # /sys works for what programs read there (nproc reads .../cpu/online)
    r = sandbox.exec("cat /sys/devices/system/cpu/online && nproc", timeout=30)
    assert r.exit_code == 0 and r.stdout.split()[1].isdigit(), r


def test_dev_lives_on_the_upper_tmpfs_outside_snapshots(client, base_layer):
    with client.create(layers=[base_layer], disk_mb=64) as sb:
        r = sb.exec("echo hi > /dev/mine && cat /dev/mine && ls /dev/null /dev/pts/ptmx"
                    " && echo x > /dev/null && head -c 4 /dev/zero | wc -c", timeout=30)
        assert r.exit_code == 0 and r.stdout == b"hi\n/dev/null\n/dev/pts/ptmx\n4\n", (r.stdout, r.stderr)
        # /dev shares the disk limit: it cannot take more than disk_mb
        r = sb.exec("dd if=/dev/zero of=/dev/big bs=1M count=100", timeout=60)
        assert r.exit_code != 0 and b"No space left" in r.stderr, r.stderr
        sb.exec("rm -f /dev/big", timeout=30)
        snap = sb.snapshot()
        try:
            with client.create(layers=snap.layers) as twin:
                assert twin.exec("test -e /dev/mine", timeout=30).exit_code == 1
        finally:
            client.layers.remove(snap.layer.name)

"""Teardown shared by the image benchmarks: unmount what is left under a
scratch root (deepest first) and remove it without crossing file systems."""
import subprocess
from pathlib import Path


def unmount_and_remove(root: Path) -> None:
    for line in reversed(Path("/proc/self/mountinfo").read_text().splitlines()):
        mp = line.split()[4]
        if mp.startswith(str(root) + "/"):
            subprocess.run(["umount", mp], check=False)
    subprocess.run(["rm", "-rf", "--one-file-system", str(root)], check=False)

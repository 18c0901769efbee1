#!/usr/bin/env python3
"""Network for microVMs and desktop VMs (issue 16), in one run:

  * create -> exec `true` -> destroy with a network vs without, interleaved
    (warm: clones of the node's template, which both kinds share; the first
    vm create boots and saves the desktop template, ~100 s, not counted);
  * a bulk download through the VM's tap (guest virtio-net -> QEMU's
    userspace tap backend -> nftables chain -> masquerade) vs a container's
    veth, from the same server, alternating.

Reuses bench/net/bench.py's test "internet" (a netns behind a veth,
203.0.113.77) and reader. Self-contained: its own warrend (--sandbox-net
10.214.1.0/24; the microVM guest of build/microvm-guest or WARREN_MICROVM_DIR,
the vm guest of WARREN_VM_DIR or /var/cache/warren/vm). Prints a markdown
section; --append adds it to bench/RESULTS.md. Run as root:

  .venv/bin/python bench/net/microvm.py [--backend microvm|vm] [-n 10] [--mib 64] [--downloads 3] [--append]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("warren_net_bench", ROOT / "bench/net/bench.py")
nb = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(nb)
it = nb.it
warren = nb.warren


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", choices=["microvm", "vm"], default="microvm")
    ap.add_argument("-n", type=int, default=10, help="cycles of each kind")
    ap.add_argument("--mib", type=int, default=64, help="MiB per download")
    ap.add_argument("--downloads", type=int, default=3, help="downloads of each kind (the median is reported)")
    ap.add_argument("--append", action="store_true", help="append the section to bench/RESULTS.md")
    args = ap.parse_args()

    root = Path(tempfile.mkdtemp(prefix="warren-mvnetbench-", dir="/var/tmp"))
    (root / "layers").mkdir()
    backend = args.backend
    if backend == "vm":
        guest = ["--vm-dir", os.environ.get("WARREN_VM_DIR", "/var/cache/warren/vm")]
        memory, first_timeout, label = 1024, 900, "vm (desktop VM)"
    else:
        guest, memory, first_timeout, label = it.microvm_dir_args(), 256, 180, "microvm"
    d = it.Daemon(root, "mvnetbench", root / "layers", it.NODE_PREFIX + "mb",
                  extra_args=[*guest, "--warm-shells", "0", "--sandbox-net", "10.214.1.0/24"])
    net = None
    try:
        d.start()
        c = d.client
        if backend not in c.status().backends:
            sys.exit(f"bench: the {backend} backend is not offered")
        try:
            c.layers.get(it.BASE)
        except warren.NotFound:
            c.layers.build(it.BASE, dir=str(it.BASE_ROOTFS), timeout=900)
        net = nb.Internet(args.mib)
        policy = {"allow": [f"tcp:{nb.SERVER}:{nb.PORT}"]}

        ids: dict[bool, list[str]] = {False: [], True: []}

        def cycle(network, timeout=180):
            t0 = time.perf_counter()
            sb = c.create(backend=backend, layers=[it.BASE], memory_mb=memory, network=network, timeout=timeout)
            ids[network is not None].append(sb.id)
            r = sb.exec(["true"], timeout=60)
            sb.destroy(timeout=60)
            assert r.exit_code == 0
            return (time.perf_counter() - t0) * 1000

        cycle(None, first_timeout)  # builds the template
        cycle(policy)
        plain, withnet = [], []
        for _ in range(args.n):
            plain.append(cycle(None))
            withnet.append(cycle(policy))
        p50p, p50n = statistics.median(plain), statistics.median(withnet)
        # Where a create's time went (the daemon's "microvm started" line, ms
        # since the create began): the host's part before QEMU starts
        # (disk, tap + chain) and the guest's after the restore (its hello:
        # root, and for a network the NIC driver and configuration).
        phases: dict[bool, dict[str, list[float]]] = {False: {}, True: {}}
        log = d.log_path.read_text(errors="replace")
        for kind in (False, True):
            for sid in ids[kind][2 if kind else 1:]:  # the warm-up cycles left out
                m = re.search(rf"{backend} started .*sandbox={sid} .*disk=(\d+) network=(\S+) launched=(\d+) "
                              rf"restored=(\d+) answered=(\d+)", log)
                if not m:
                    continue
                _disk, _netw, launched, restored, answered = m.groups()
                ph = phases[kind]
                ph.setdefault("launch", []).append(float(launched))
                ph.setdefault("hello", []).append(float(answered) - float(restored))
                ph.setdefault("answered", []).append(float(answered))

        def med(kind: bool, key: str) -> str:
            xs = phases[kind].get(key, [])
            return f"{statistics.median(xs):.0f}" if xs else "-"
        mp, mn = statistics.mean(plain), statistics.mean(withnet)

        # ---- bulk download: a microVM's tap vs a container's veth, alternating
        vmd, ctd = [], []
        with c.create(backend=backend, layers=[it.BASE], memory_mb=memory, network=policy, timeout=180) as v, \
                c.create(layers=[it.BASE], network=policy) as ct:
            for _ in range(args.downloads):
                vmd.append(nb.download_sandbox(v))
                ctd.append(nb.download_sandbox(ct))
            traffic = v.info().traffic
        vm_med, ct_med = statistics.median(vmd), statistics.median(ctd)

        load = Path("/proc/loadavg").read_text().split()[:3]
        out: list[str] = []
        out.append(f"## {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} — {label} network (issue 16)\n")
        out.append(f"- command: `.venv/bin/python bench/net/microvm.py --backend {backend} -n {args.n} "
                   f"--mib {args.mib} --downloads {args.downloads}`")
        out.append(f"- host: {os.cpu_count()} CPUs, load {' '.join(load)} at the end; own warrend (release build), "
                   f"--sandbox-net 10.214.1.0/24, {backend} on TCG (warm: template clones, {memory} MiB); server in "
                   f"a netns behind a veth ({nb.SERVER})")
        out.append("")
        out.append("| measure | without network | with network | ratio |")
        out.append("|---|---|---|---|")
        out.append(f"| {backend} create→exec true→destroy p50 (ms), n={args.n} each, interleaved | {p50p:.0f} | {p50n:.0f} | "
                   f"**{(p50n / p50p - 1) * 100:+.0f} %** |")
        out.append(f"| same, mean (ms) | {mp:.0f} | {mn:.0f} | {(mn / mp - 1) * 100:+.0f} % |")
        out.append(f"| create: QEMU started (disk, tap + chain) p50 (ms) | {med(False, 'launch')} | "
                   f"{med(True, 'launch')} | |")
        out.append(f"| create: restore → hello answered (root; NIC driver + config) p50 (ms) | {med(False, 'hello')} | "
                   f"{med(True, 'hello')} | |")
        out.append(f"| create: agent answered p50 (ms) | {med(False, 'answered')} | {med(True, 'answered')} | |")
        out.append("")
        out.append(f"| bulk download | container (veth) | {backend} (tap) | ratio |")
        out.append("|---|---|---|---|")
        out.append(f"| {args.mib} MiB, median of {args.downloads} (MiB/s) | {ct_med / 2**20:.1f} | {vm_med / 2**20:.1f} | "
                   f"**{vm_med / ct_med:.2f}×** |")
        out.append("")
        out.append(f"- cycles (ms): without {[round(x) for x in plain]}, with {[round(x) for x in withnet]}")
        out.append(f"- downloads (MiB/s): container {[round(x / 2**20, 1) for x in ctd]}, "
                   f"{backend} {[round(x / 2**20, 1) for x in vmd]}; the VM's traffic after them: {traffic}")
        text = "\n".join(out) + "\n"
        print(text)
        if args.append:
            res = ROOT / "bench/RESULTS.md"
            body = res.read_text()
            first = body.index("\n## ", body.index("\n## ") + 1)
            res.write_text(body[:first + 1] + text + "\n" + body[first + 1:])
        return 0
    finally:
        if net is not None:
            net.close()
        if d.proc is not None and d.proc.poll() is None:
            d.stop()
        it._kill_leftover_sandboxes(root)
        it._unmount_under(root)
        m = re.search(r"nft_table[=\":\s]+\"?(warren_[0-9a-f]{1,4})", d.log_path.read_text(errors="replace"))
        if m:
            subprocess.run(["nft", "delete", "table", "inet", m.group(1)], check=False, capture_output=True)
        subprocess.run(["rm", "-rf", "--one-file-system", str(root)], check=False)


if __name__ == "__main__":
    sys.exit(main())

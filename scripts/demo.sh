#!/bin/bash
# Demo of the main job: starts warrend on a private state dir, builds the base
# layer (once), creates a sandbox, runs commands in it through the Python
# SDK, destroys it and stops the daemon. Needs scripts/setup.sh first.
# State dir: $WARREN_DEMO_STATE (default .state/demo), kept between runs so the
# base layer is built only once.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
state=${WARREN_DEMO_STATE:-$root/.state/demo}
rootfs=/var/cache/warren/rootfs/debian-12
sock=$state/warrend.sock
mkdir -p "$state"

"$root/build/src/warrend/warrend" --state-dir "$state" --socket "$sock" \
  --layer-store "$state/layers" >"$state/warrend.log" 2>&1 &
pid=$!
cleanup() {
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
  fi
  wait "$pid" 2>/dev/null || true
  # warrend keeps its layer mounts for a restarted daemon to adopt; the demo
  # is done with them (the next run mounts them again).
  awk -v s="$state/" 'index($5, s) == 1 {print $5}' /proc/self/mountinfo | sort -r |
    while read -r m; do umount "$m" || true; done
}
trap cleanup EXIT

WARREN_ADDR=unix:$sock ROOTFS=$rootfs "$root/.venv/bin/python" - <<'PY'
import os, sys, time
import warren

client = warren.Client()
for _ in range(300):  # the daemon answers within 30 s or the demo fails
    try:
        st = client.status(timeout=1)
        break
    except warren.WarrenError:
        time.sleep(0.1)
else:
    sys.exit("warrend did not come up; see its log")
print(f"warrend {st.version} node={st.node_id} cgroup={st.cgroup_version} backends={st.backends}")

base = "base/debian-12@1"
try:
    layer = client.layers.get(base)
except warren.NotFound:
    t = time.monotonic()
    layer = client.layers.build(base, dir=os.environ["ROOTFS"], timeout=900)
    print(f"built {base} in {time.monotonic() - t:.1f} s")
print(f"layer {layer.name} {layer.digest[:19]}… {layer.size_bytes >> 20} MiB")

t = time.monotonic()
with client.create(layers=[base], cpu=1, memory_mb=512, labels={"demo": "1"}) as sb:
    print(f"created {sb.id} in {(time.monotonic() - t) * 1000:.0f} ms")
    r = sb.exec("grep PRETTY_NAME /etc/os-release; id; hostname; python3 -c 'print(6*7)'",
                timeout=30)
    sys.stdout.write(r.text)
    print(f"exit={r.exit_code} in {r.duration_s * 1000:.0f} ms")
    sb.files.write("/w/hello.txt", b"hello from the host\n", make_parents=True)
    print(sb.exec("cat /w/hello.txt", timeout=10).text, end="")
    r = sb.exec("sleep 5", timeout=0.5)
    print(f"timeout honoured: timed_out={r.timed_out} after {r.duration_s:.2f} s")
print("destroyed; sandboxes left:", len(client.list()))
PY

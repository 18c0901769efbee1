#!/bin/bash
# The fncall row of bench/ab_warrend.sh alone (same daemons, same ABBA
# rounds, same batches: 64 to warm, then 4 x 500 `print(1+1)`), with the
# CPU of each daemon and its workers (cpuacct) per call, one line per
# side-round: fncall without the teardown of a c64 loop just before it.
# Usage: bench/ab_fncall.sh A_WARREND B_WARREND [rounds]
# (The header below is bench/ab_warrend.sh's: its environment applies.)
# Same-run A/B of two warrend builds: exec round trip (bench/exec/bench.py),
# create -> exec -> destroy at concurrency 64 (bench/warren_loop.py), fncall
# throughput (fncall_batch of 500 trivial python calls, 4 batches) and idle
# density (bench/density/bench.py: host MemAvailable drop per idle sandbox,
# WARREN_AB_DENSITY_N sandboxes, default 300; 0 skips the row), in
# interleaved rounds (ABBA order) so that load changes hit both alike.
#
# Usage: bench/ab_warrend.sh A_WARREND B_WARREND [rounds] [iterations]
#   WARREN_AB_A_ARGS / WARREN_AB_B_ARGS: extra warrend flags of one side
#   (e.g. WARREN_AB_B_ARGS=--limit-views=off to A/B one build against itself)
#   A_WARREND, B_WARREND  paths of the two warrend binaries (each finds its
#                         warren-init/warren-spawn next to it or in ../init)
# Both daemons run at once on private state dirs under /var/tmp/warren-ab,
# sharing one layer store (base/debian-12@1 built from
# /var/cache/warren/rootfs/debian-12 if missing). Prints one table per row
# kind with the per-round numbers and the B/A ratio of their medians.
#   WARREN_AB_NICE: niceness of the whole run (default -15 as root, so that
#   background load, e.g. a compiler, disturbs both sides less; 0 keeps it)
set -euo pipefail
if [ "$(id -u)" = 0 ] && [ "${WARREN_AB_NICE:--15}" != 0 ]; then
  renice -n "${WARREN_AB_NICE:--15}" -p $$ >/dev/null
fi
root=$(cd "$(dirname "$0")/.." && pwd)
a=${1:?A warrend}
b=${2:?B warrend}
rounds=${3:-3}
iters=${4:-600}
py=${WARREN_PYTHON:-$root/.venv/bin/python}
work=/var/tmp/warren-ab
rootfs=${WARREN_BASE_ROOTFS:-/var/cache/warren/rootfs/debian-12}
mkdir -p "$work/layers"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rmdir /sys/fs/cgroup/cpuacct/warren-ab-A/* /sys/fs/cgroup/cpuacct/warren-ab-B/* 2>/dev/null || true
  rmdir /sys/fs/cgroup/cpuacct/warren-ab-A /sys/fs/cgroup/cpuacct/warren-ab-B 2>/dev/null || true
}
cpu_ns() {  # CPU used so far by daemon $1 and its sandboxes (ns; 0 without cpuacct)
  cat "/sys/fs/cgroup/cpuacct/warren-ab-$1/cpuacct.usage" 2>/dev/null || echo 0
}
trap cleanup EXIT
start() {  # name binary
  local n=$1 bin=$2 extra_var="WARREN_AB_${1}_ARGS"
  local -a extra
  read -r -a extra <<<"${!extra_var:-}"
  mkdir -p "$work/$n"
  # Each daemon starts in a cpuacct cgroup of its own (its sandboxes' cgroups
  # nest under it), so the CPU a create->exec->destroy cycle costs is read
  # from it: less disturbed by background load than the rate.
  local acct=/sys/fs/cgroup/cpuacct/warren-ab-$n
  if [ -d /sys/fs/cgroup/cpuacct ] && mkdir -p "$acct" 2>/dev/null; then
    echo $$ >"$acct/cgroup.procs"
  fi
  "$bin" "${extra[@]}" --state-dir "$work/$n/state" --socket "$work/$n.sock" --layer-store "$work/layers" \
    --node-id "ab$(echo $n | tr A-Z a-z)" >"$work/$n.log" 2>&1 </dev/null &
  pids+=($!)
  [ -d "$acct" ] && echo $$ >/sys/fs/cgroup/cpuacct/cgroup.procs
  PYTHONPATH=$root/sdk/python "$py" - "$work/$n.sock" "$rootfs" <<'EOF'
import sys, time, warren
c = warren.Client("unix:" + sys.argv[1])
for _ in range(300):
    try:
        c.status(timeout=2); break
    except warren.WarrenError:
        time.sleep(0.1)
try:
    c.layers.get("base/debian-12@1")
except warren.NotFound:
    c.layers.build("base/debian-12@1", dir=sys.argv[2])
EOF
}
start A "$a"
start B "$b"
echo "A=$a"
echo "B=$b"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
density_n=${WARREN_AB_DENSITY_N:-300}
declare -A exec_p50 loop_rate loop_cpu fncall_rate idle_kib
for r in $(seq 1 "$rounds"); do
  order="A B"
  ((r % 2 == 0)) && order="B A"
  for n in $order; do
    c0=$(cpu_ns $n)
    rate=$(PYTHONPATH=$root/sdk/python "$py" - "unix:$work/$n.sock" <<'EOF2'
import sys, time, warren
c = warren.Client(sys.argv[1])
req = [warren.FnCallRequest("print(1+1)", layers=["base/debian-12@1"])]
c.fncall_batch(req * 64)
n, t0 = 0, time.monotonic()
for _ in range(4):
    rs = c.fncall_batch(req * 500)
    n += len(rs)
print(round(n / (time.monotonic() - t0), 1))
EOF2
)
    c1=$(cpu_ns $n)
    echo "round $r $n rate $rate cpu_ms_per_call $(echo "($c1 - $c0) / 1000000 / 2064" | bc -l | xargs printf '%.3f') load $(cut -d' ' -f1 /proc/loadavg)"
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"

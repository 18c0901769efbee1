#!/bin/bash
# The fncall row of bench/ab_warrend.sh alone (same daemons, same ABBA
# rounds, same batches: 64 to warm, then 4 x 500 `print(1+1)`), with the
# CPU of each daemon and its workers (cpuacct) per call, one line per
# side-round: fncall without the teardown of a c64 loop just before it.
# Usage: bench/ab_fncall.sh A_WARREND B_WARREND [rounds]
#   The environment of bench/ab_common.sh applies.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=bench/ab_common.sh
source "$root/bench/ab_common.sh"
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

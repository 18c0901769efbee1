#!/bin/bash
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
#   WARREN_AB_SETTLE: seconds to wait before each row after the first of a
#   side's round (default 0). The kernel tears down what the c64 loop leaves
#   (mount namespaces, cgroups, network namespaces) in kworkers and RCU
#   callbacks after the loop has returned; without a pause that work lands
#   on the side's next row (fncall), which then measures c64's tail too.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
iters=${4:-600}
# shellcheck source=bench/ab_common.sh
source "$root/bench/ab_common.sh"
start A "$a"
start B "$b"
echo "A=$a"
echo "B=$b"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
density_n=${WARREN_AB_DENSITY_N:-300}
settle=${WARREN_AB_SETTLE:-0}
echo "settle between rows: ${settle} s"
declare -A exec_p50 loop_rate loop_cpu fncall_rate idle_kib
for r in $(seq 1 "$rounds"); do
  # ABBA: odd rounds run A first, even rounds B first, so that what one side
  # leaves running (the kernel's deferred teardown of 400 sandboxes: network
  # namespaces, mounts, cgroups) weighs on both alike. With a fixed order an
  # A/B of one binary against itself read c64 0.93 and CPU per cycle 1.08.
  order="A B"
  ((r % 2 == 0)) && order="B A"
  for n in $order; do
    out=$(PYTHONPATH=$root/sdk/python "$py" "$root/bench/exec/bench.py" --addr "unix:$work/$n.sock" \
      --iterations "$iters" --rounds 1 --max-seconds 60 | grep -E '^\| warren_exec' | awk -F'|' '{print $4}' | tr -d ' ')
    exec_p50[$n]+="$out "
    c0=$(cpu_ns $n)
    out=$(PYTHONPATH=$root/sdk/python "$py" "$root/bench/warren_loop.py" --addr "unix:$work/$n.sock" \
      --layer base/debian-12@1 --concurrency 64 --iterations "$iters" --max-seconds 60 | tail -1)
    c1=$(cpu_ns $n)
    sleep "$settle"
    rate=$(printf '%s' "$out" | "$py" -c 'import json,sys; d=json.load(sys.stdin); print(round(d.get("rate_per_s", d.get("rate", 0)),1))')
    done_n=$(printf '%s' "$out" | "$py" -c 'import json,sys; d=json.load(sys.stdin); print(d.get("completed", d.get("iterations", 0)))')
    loop_rate[$n]+="$rate "
    ((c1 > 0 && done_n > 0)) && loop_cpu[$n]+="$(echo "($c1 - $c0) / 1000000 / $done_n" | bc -l | xargs printf '%.2f') "
    rate=$(PYTHONPATH=$root/sdk/python "$py" - "unix:$work/$n.sock" <<'EOF'
import sys, time, warren
c = warren.Client(sys.argv[1])
req = [warren.FnCallRequest("print(1+1)", layers=["base/debian-12@1"])]
c.fncall_batch(req * 64)  # warm the pool
n, t0 = 0, time.monotonic()
for _ in range(4):
    rs = c.fncall_batch(req * 500)
    assert all(r.stdout == b"2\n" for r in rs), [r for r in rs if r.stdout != b"2\n"][:1]
    n += len(rs)
print(round(n / (time.monotonic() - t0), 1))
EOF
)
    fncall_rate[$n]+="$rate "
    if ((density_n > 0)); then
      sleep "$settle"
      kib=$(PYTHONPATH=$root/sdk/python "$py" "$root/bench/density/bench.py" --addr "unix:$work/$n.sock" \
        -n "$density_n" --concurrency 8 --max-seconds 120 --min-available-gib 4 | awk -F'|' '/^\| warren_idle/ {gsub(/ /, "", $4); print $4}')
      idle_kib[$n]+="$kib "
    fi
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
med() { printf '%s\n' $1 | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
printf '| row | A per round | B per round | A median | B median | B/A |\n| --- | --- | --- | ---: | ---: | ---: |\n'
rows=(exec_p50_ms c64_rate_per_s fncall_calls_per_s)
[[ -n ${loop_cpu[A]:-} ]] && rows+=(c64_cpu_ms_per_cycle)
((density_n > 0)) && rows+=(idle_kib_per_sandbox)
for row in "${rows[@]}"; do
  case $row in
    exec_p50_ms) va=${exec_p50[A]}; vb=${exec_p50[B]} ;;
    c64_rate_per_s) va=${loop_rate[A]}; vb=${loop_rate[B]} ;;
    fncall_calls_per_s) va=${fncall_rate[A]}; vb=${fncall_rate[B]} ;;
    c64_cpu_ms_per_cycle) va=${loop_cpu[A]}; vb=${loop_cpu[B]} ;;
    idle_kib_per_sandbox) va=${idle_kib[A]}; vb=${idle_kib[B]} ;;
  esac
  ma=$(med "$va"); mb=$(med "$vb")
  printf '| %s | %s | %s | %s | %s | %.2f |\n' "$row" "$va" "$vb" "$ma" "$mb" "$(echo "$mb / $ma" | bc -l)"
done

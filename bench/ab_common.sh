# Shared by bench/ab_warrend.sh and bench/ab_fncall.sh (sourced, not run):
# starts the two daemons of a same-run A/B on private state dirs under
# /var/tmp/warren-ab, each in a cpuacct cgroup of its own, sharing one layer
# store (base/debian-12@1 built from WARREN_BASE_ROOTFS if missing).
# Expects: root (the repository), $1 = A warrend, $2 = B warrend, $3 = rounds.
# Defines: a, b, rounds, py, work, pids, cpu_ns NAME, start NAME BINARY, and
# an EXIT trap that stops both daemons and removes their cgroups.
#   WARREN_AB_A_ARGS / WARREN_AB_B_ARGS: extra warrend flags of one side
#   WARREN_AB_NICE: niceness of the whole run (default -15 as root, so that
#   background load, e.g. a compiler, disturbs both sides less; 0 keeps it)
#   WARREN_PYTHON: the interpreter with the SDK's dependencies (.venv)
set -euo pipefail
if [ "$(id -u)" = 0 ] && [ "${WARREN_AB_NICE:--15}" != 0 ]; then
  renice -n "${WARREN_AB_NICE:--15}" -p $$ >/dev/null
fi
a=${1:?A warrend}
b=${2:?B warrend}
rounds=${3:-3}
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

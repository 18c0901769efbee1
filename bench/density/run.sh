#!/bin/bash
# Density bench with a private warrend: starts $WARREND (default: this tree's
# build) on a private state dir under $DIR (default /var/tmp/warren-density),
# with the soft RLIMIT_NOFILE at $NOFILE_SOFT (default 1024, as under systemd;
# warrend raises it to the hard limit itself), builds base/debian-12@1 there if missing, runs
# bench.py with the arguments given, then stops the daemon (SIGTERM; its
# sandboxes were destroyed by bench.py).
#   bench/density/run.sh -n 5000 --concurrency 4 [--record] ...
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WARREND=${WARREND:-$ROOT/build/src/warrend/warrend}
DIR=${DIR:-/var/tmp/warren-density}
PY=${PY:-$ROOT/.venv/bin/python}
[ -x "$PY" ] || PY=/work/main/.venv/bin/python
BASE_ROOTFS=${WARREN_BASE_ROOTFS:-/var/cache/warren/rootfs/debian-12}
mkdir -p "$DIR"
hard=$(ulimit -Hn)
soft=${NOFILE_SOFT:-1024}
prlimit --nofile="$soft":"$hard" "$WARREND" --state-dir "$DIR/state" --socket "$DIR/warrend.sock" \
  --layer-store "$DIR/layers" --node-id density --max-sandboxes 16384 >"$DIR/warrend.log" 2>&1 &
pid=$!
# warrend keeps an unused layer mount for --mount-grace-ms and may leave it
# at exit: unmount whatever is left under $DIR once it is gone.
cleanup() {
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  awk -v d="$DIR/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r | while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m" || true
  done
}
trap cleanup EXIT
export PYTHONPATH=$ROOT/sdk/python
"$PY" -c "
import time, warren
c = warren.Client('unix:$DIR/warrend.sock')
for i in range(300):  # up to 30 s for the daemon to answer
    try:
        c.status(timeout=1)
        break
    except warren.WarrenError:
        time.sleep(0.1)
if not any(l.name == 'base/debian-12@1' for l in c.layers.list()):
    c.layers.build('base/debian-12@1', dir='$BASE_ROOTFS')
"
DENSITY_COMMAND="bench/density/run.sh $(printf '%q ' "$@")" \
  "$PY" "$ROOT/bench/density/bench.py" --addr "unix:$DIR/warrend.sock" --daemon-pid "$pid" "$@"

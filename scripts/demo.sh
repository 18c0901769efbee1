#!/bin/bash
# Demo of the main job: starts warrend on a private state dir, builds the
# layers (once: base/debian-12@1, toolset/python@1 and
# workspace/more-itertools@10.1.0, from the rootfs dirs setup.sh made),
# checks the node, then runs `warren eval`: $WARREN_DEMO_N (default 200)
# SWE-style rollouts of the tasks in eval/tasks/more-itertools (a real code
# base with its real test suite; bugs injected, fixed or not by scripted
# agents) with concurrency $WARREN_DEMO_C (default 4), each in a fresh
# sandbox, and prints the summary; then stops the daemon. Exits non-zero if
# any rollout's pass/fail differs from its task's expected one.
# Needs scripts/setup.sh first. State dir: $WARREN_DEMO_STATE (default
# .state/demo), kept between runs so the layers are built only once; the JSON
# report goes to <state>/eval-report.json.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
state=${WARREN_DEMO_STATE:-$root/.state/demo}
rootfs=/var/cache/warren/rootfs/debian-12
sock=$state/warrend.sock
# The Python with the SDK (setup.sh's .venv) and this tree's SDK first.
py=${WARREN_PYTHON:-$root/.venv/bin/python}
export WARREN_PYTHON=$py PYTHONPATH=$root/sdk/python${PYTHONPATH:+:$PYTHONPATH}
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

WARREN_ADDR=unix:$sock "$py" - <<'PY'
import sys, time
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
PY

rootfs_dir=/var/cache/warren/rootfs
for d in debian-12 toolset-python workspace-more-itertools-10.1.0; do
  [[ -e "$rootfs_dir/$d.complete" ]] || { echo "demo: $rootfs_dir/$d missing: run scripts/setup.sh" >&2; exit 1; }
done
# warren eval runs the SDK's runner (warren.eval) with $WARREN_PYTHON.
WARREN_ADDR=unix:$sock "$root/build/src/cli/warren" eval \
  --tasks "$root/eval/tasks/more-itertools" \
  -n "${WARREN_DEMO_N:-200}" -c "${WARREN_DEMO_C:-4}" \
  --layer-dir "base/debian-12@1=$rootfs" \
  --layer-dir "toolset/python@1=$rootfs_dir/toolset-python" \
  --layer-dir "workspace/more-itertools@10.1.0=$rootfs_dir/workspace-more-itertools-10.1.0" \
  --report "$state/eval-report.json"

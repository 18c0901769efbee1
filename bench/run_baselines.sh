#!/bin/bash
# Baselines for warren's container start path, run back to back in ONE
# invocation so every figure can be read as a ratio against the raw floor
# measured minutes apart on the same (shared, noisy) machine.
#
# Rows (each: N sandboxes one after the other, capped at MAX_S seconds, split
# into R rounds that are interleaved with the other rows' rounds):
#   raw_floor          clone(user,mnt,pid,uts,ipc,net,cgroup) + tmpfs upper +
#                      idmapped EROFS lower + overlay + pivot_root + exec true
#                      (warren's own mount path, nothing else)       = 1.00
#   raw_floor_noidmap  same, root inside = host root, no idmapped lower
#   raw_floor_full     raw_floor + /proc, /dev (tmpfs + nodes), devpts, shm
#   raw_floor_cg       raw_floor_full + a cgroup per sandbox (memory, pids,
#                      cpu, freezer; limits set; joined before release)
#   bwrap              bubblewrap --unshare-all --bind <overlay> / --proc --dev
#   crun               crun run, OCI config (same 7 namespaces, uid map like
#                      warren), --cgroup-manager=disabled
#   crun_cg            crun run, cgroupfs (v1) manager, pids+memory limits,
#                      cgroupsPath under our own cgroup
#   runc_cg            runc run, same config as crun_cg
#   warren_c1/16/64    create -> exec true -> destroy through the Python SDK
#                      (run_warren_rows; skipped when build/src/warrend/warrend
#                      is absent)
# For bwrap/crun/runc the overlay (fresh tmpfs upper + the EROFS lower) is
# mounted and unmounted per iteration by peers/peer_loop, inside the timing.
#
# Usage: bench/run_baselines.sh [-n ITERATIONS] [-t MAX_SECONDS] [-r ROUNDS]
#                               [--only ROWS] [--no-record] [--no-warren]
#   -n N         iterations per row (default 300)
#   -t S         cap per row in seconds (default 60)
#   -r R         rounds (default 3): each row runs N/R iterations (S/R
#                seconds) per round, rows in turn, so load changes hit all
#                rows alike; the table merges a row's rounds
#   --only ROWS  comma list of row names (raw_floor is always run first)
#   --no-record  do not append to bench/RESULTS.md
#   --no-warren  skip the warren rows even if warrend is built
# Env: BENCH_NICE (default 10: the machine is shared; every row runs at the
#      same niceness, so ratios stay fair), BENCH_CACHE (default
#      /var/tmp/warren-bench: EROFS image + helper binaries + warren state),
#      WARREN_ROOTFS (default /var/cache/warren/rootfs/debian-12).
# Needs root, gcc, make, erofs-utils; bwrap/crun/runc rows are skipped (and
# said so) when the tool is missing.
# Exit status: 0 all rows ok and nothing left behind; 1 a row failed;
# 3 something was left behind (mounts, dirs, cgroups, runtime state).
set -euo pipefail

bench=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$bench/.." && pwd)
cmdline="bench/run_baselines.sh${*:+ $*}"
[[ -n ${WARREND:-} ]] && cmdline="WARREND=$WARREND $cmdline"
iters=300
max_s=60
rounds=3
only=""
record=1
warren_rows=1
while (($#)); do
  case $1 in
    -n) iters=$2; shift 2 ;;
    -t) max_s=$2; shift 2 ;;
    -r) rounds=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --no-record) record=0; shift ;;
    --no-warren) warren_rows=0; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "run_baselines: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ $iters =~ ^[0-9]+$ && $iters -ge 1 ]] || { echo "run_baselines: -n must be a positive integer" >&2; exit 2; }
[[ $max_s =~ ^[0-9]+$ && $max_s -ge 1 ]] || { echo "run_baselines: -t must be a positive integer" >&2; exit 2; }
[[ $rounds =~ ^[0-9]+$ && $rounds -ge 1 && $rounds -le $iters ]] ||
  { echo "run_baselines: -r must be 1..ITERATIONS" >&2; exit 2; }
[[ $(id -u) == 0 ]] || { echo "run_baselines: needs root" >&2; exit 2; }

nice_n=${BENCH_NICE:-10}
cache=${BENCH_CACHE:-/var/tmp/warren-bench}
rootfs=${WARREN_ROOTFS:-/var/cache/warren/rootfs/debian-12}
[[ -f $rootfs.complete ]] || { echo "run_baselines: $rootfs.complete missing (rootfs not ready)" >&2; exit 2; }

want() {  # want ROW: is ROW selected by --only?
  [[ -z $only ]] && return 0
  [[ ,$only, == *,$1,* ]]
}

# ---------------------------------------------------------------- set-up
mkdir -p "$cache/bin"
nice -n "$nice_n" make -s -C "$bench" O="$cache/bin" >&2
image=$cache/debian-12.erofs
if [[ ! -f $image || $rootfs.complete -nt $image ]]; then
  echo "run_baselines: building $image from $rootfs" >&2
  nice -n "$nice_n" mkfs.erofs --quiet "$image.tmp.$$" "$rootfs"
  mv "$image.tmp.$$" "$image"
fi

work=$(mktemp -d /tmp/warren-bench.XXXXXX)
lower=$work/lower
mkdir "$lower"
own_cg=$(awk -F: '$2=="memory"{print $3; exit}' /proc/self/cgroup)
[[ -n $own_cg ]] || own_cg=$(awk -F: '$1=="0"{print $3; exit}' /proc/self/cgroup)
cg_parent=${own_cg%/}/warren-bench-$$
warrend_pid=""
row_pid=""

snapshot() {  # what a run could leave behind, one item per line
  grep -E "/raw_floor\.|/peer_loop\.|$work" /proc/self/mountinfo | awk '{print "mount " $5}' || true
  ls -d /tmp/raw_floor.* /tmp/peer_loop.* 2>/dev/null | sed 's/^/dir /' || true
  find /sys/fs/cgroup -mindepth 2 -maxdepth 8 -type d \( -name "warren-bench-$$" -o -name 'raw_floor-*' \) \
    2>/dev/null | sed 's/^/cgroup /' || true
  ls -d /run/crun/bench-* /run/runc/bench-* 2>/dev/null | sed 's/^/runtime-state /' || true
  losetup -a 2>/dev/null | grep -F "$image" | sed 's/^/loop /' || true
}

remove_bench_cgroups() {
  # crun/runc remove their leaf cgroup on delete; the parents are ours. A
  # cgroup still holding a process fails rmdir and shows up as left behind.
  find /sys/fs/cgroup -mindepth 2 -maxdepth 8 -depth -type d -path "*/warren-bench-$$*" \
    -exec rmdir {} \; 2>/dev/null || true
}

cleanup() {
  local i
  if [[ -n $row_pid ]]; then  # interrupted mid-row: stop it, bounded
    kill -TERM "$row_pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do kill -0 "$row_pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$row_pid" 2>/dev/null || true
    wait "$row_pid" 2>/dev/null || true
  fi
  if [[ -n $warrend_pid ]]; then stop_warrend; fi
  if mountpoint -q "$lower"; then umount "$lower" || umount -l "$lower"; fi
  remove_bench_cgroups
  rm -rf --one-file-system "$work"
}
trap cleanup EXIT
trap "exit 130" INT TERM

if "$cache/bin/erofs_mount" "$image" "$lower"; then
  lower_how="file-backed EROFS (fsopen/fsmount)"
else
  echo "run_baselines: file-backed EROFS mount failed, falling back to a loop device" >&2
  mount -t erofs -o ro,loop "$image" "$lower"
  lower_how="EROFS on a loop device"
fi
before=$(snapshot | grep -v "$work" || true)
load_before=$(cut -d" " -f1-3 /proc/loadavg)

# ------------------------------------------------------------------ rows
# A row is a function row_<name> that runs ONE round of it (n_round
# iterations, s_round seconds). Rounds are interleaved (floor, A, B, ...,
# floor, A, B, ...) so that a change in the machine's load hits every row
# alike; a row's samples are merged over its rounds.
failed=0
rows=()
mkdir "$work/samples"
: >"$work/rounds.jsonl"
: >"$work/skipped.jsonl"
run_row() {  # run_row NAME CMD...: one round of a row, its JSON line kept
  local name=$1; shift
  echo "run_baselines: round $round: $name: $*" >&2
  local line
  # In the background + wait, so that a signal to this script is handled at
  # once (cleanup stops the row) rather than when the row ends.
  BENCH_SAMPLES=$work/samples/$name nice -n "$nice_n" "$@" >"$work/row.out" &
  row_pid=$!
  wait "$row_pid" || true
  row_pid=""
  line=$(tail -n 1 "$work/row.out")
  if ! printf '%s' "$line" | grep -q '"ok": *true'; then
    echo "run_baselines: row $name FAILED; the end of its output:" >&2
    tail -n 5 "$work/row.out" | sed 's/^/  | /' >&2
    failed=1
    line="{\"name\":\"$name\",\"ok\":false,\"iterations\":0}"
  fi
  # The row's own name (raw_floor prints its variant) is replaced by ours.
  printf '%s\n' "$line" | sed "s/\"name\": *\"[^\"]*\"/\"name\":\"$name\"/" >>"$work/rounds.jsonl"
}
skip_row() {
  echo "run_baselines: $1 skipped: $2" >&2
  printf '{"name":"%s","ok":false,"skipped":"%s"}\n' "$1" "$2" >>"$work/skipped.jsonl"
}
add_row() { want "$1" && rows+=("$1"); return 0; }

oci_config() {  # oci_config OUT CGROUPS(0|1): an OCI config for /bin/true
  local tmp
  tmp=$(mktemp -d "$work/spec.XXXXXX")
  (cd "$tmp" && crun spec)
  python3 - "$tmp/config.json" "$1" "$2" "$cg_parent" <<'PY'
import json, sys
src, out, cgroups, parent = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4]
c = json.load(open(src))
c["process"]["args"] = ["/bin/true"]
c["process"]["terminal"] = False
c["hostname"] = "sandbox"
lx = c["linux"]
# warren's namespace set: user, mnt, pid, uts, ipc, net, cgroup.
have = {n["type"] for n in lx["namespaces"]}
for t in ("user", "cgroup"):
    if t not in have:
        lx["namespaces"].append({"type": t})
# Root inside = host uid 1000000 (65536 ids), as warren's first slot.
lx["uidMappings"] = [{"containerID": 0, "hostID": 1000000, "size": 65536}]
lx["gidMappings"] = [{"containerID": 0, "hostID": 1000000, "size": 65536}]
if cgroups:
    lx["cgroupsPath"] = parent + "/" + ("runc" if out.endswith("runc.json") else "crun")
    lx.setdefault("resources", {})["pids"] = {"limit": 1024}
    lx["resources"]["memory"] = {"limit": 1 << 30}
json.dump(c, open(out, "w"), indent=1)
PY
  rm -rf "$tmp"
}

floor=$cache/bin/raw_floor
peer=$cache/bin/peer_loop
row_raw_floor() { run_row raw_floor "$floor" "$lower" "$n_round" "$s_round"; }
row_raw_floor_noidmap() { run_row raw_floor_noidmap "$floor" --no-idmap "$lower" "$n_round" "$s_round"; }
row_raw_floor_full() { run_row raw_floor_full "$floor" --full "$lower" "$n_round" "$s_round"; }
row_raw_floor_cg() { run_row raw_floor_cg "$floor" --full --cgroup "$lower" "$n_round" "$s_round"; }
# bwrap 0.8 has no --overlay-src/--tmp-overlay (added in 0.9): the
# per-iteration overlay comes from peer_loop and is bound as /.
row_bwrap() {
  run_row bwrap "$peer" bwrap "$lower" "$n_round" "$s_round" -- \
    bwrap --unshare-all --bind '{ROOTFS}' / --proc /proc --dev /dev /bin/true
}
# crun 1.8 refuses this hybrid host (cgroup2 lists "hugetlb") even with
# --cgroup-manager=disabled: peer_loop masks /sys/fs/cgroup/unified in its
# private mount namespace so crun sees a cgroup v1 host.
row_crun() {
  run_row crun "$peer" --mask-cgroup2 --config "$work/crun.json" crun "$lower" "$n_round" "$s_round" -- \
    crun --cgroup-manager=disabled run --bundle '{BUNDLE}' '{ID}'
}
row_crun_cg() {
  run_row crun_cg "$peer" --mask-cgroup2 --config "$work/crun_cg.json" crun_cg "$lower" "$n_round" "$s_round" -- \
    crun --cgroup-manager=cgroupfs run --bundle '{BUNDLE}' '{ID}'
}
row_runc_cg() {
  run_row runc_cg "$peer" --config "$work/runc.json" runc_cg "$lower" "$n_round" "$s_round" -- \
    runc run --bundle '{BUNDLE}' '{ID}'
}

rows+=(raw_floor)
add_row raw_floor_noidmap
add_row raw_floor_full
add_row raw_floor_cg
if want bwrap; then
  if command -v bwrap >/dev/null; then rows+=(bwrap)
  else skip_row bwrap "bwrap not installed (apt-get install bubblewrap)"; fi
fi
if command -v crun >/dev/null; then
  oci_config "$work/crun.json" 0
  oci_config "$work/crun_cg.json" 1
  add_row crun
  add_row crun_cg
else
  want crun && skip_row crun "crun not installed (apt-get install crun)"
  want crun_cg && skip_row crun_cg "crun not installed (apt-get install crun)"
fi
if want runc_cg; then
  if command -v runc >/dev/null && command -v crun >/dev/null; then
    oci_config "$work/runc.json" 1
    rows+=(runc_cg)
  else skip_row runc_cg "runc (and crun, for 'crun spec') needed"; fi
fi

# ---------------------------------------------------------------- warren
# Hook for warren's own rows: create -> exec true -> destroy via the Python
# SDK at concurrency 1, 16, 64, against a warrend started here (before the
# first round, stopped after the last) on a private state dir
# ($BENCH_CACHE/warren-state, kept so the base layer is built once).
warren_bin=${WARREND:-$root/build/src/warrend/warrend}
warren_state=$cache/warren-state
warren_sock=$warren_state/warrend.sock
warren_layer=base/debian-12@1
warren_note=""
warren_ran=""
warren_py=$root/.venv/bin/python
[[ -x $warren_py ]] || warren_py=python3

stop_warrend() {
  local i
  if kill -0 "$warrend_pid" 2>/dev/null; then
    kill -TERM "$warrend_pid"
    for ((i = 0; i < 150; i++)); do kill -0 "$warrend_pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$warrend_pid" 2>/dev/null && kill -KILL "$warrend_pid"
  fi
  wait "$warrend_pid" 2>/dev/null || true
  warrend_pid=""
}

warrend_strays() {  # pids running our warrend binary on our state dir
  local d
  for d in /proc/[0-9]*; do
    [[ $(readlink "$d/exe" 2>/dev/null) == "$(readlink -f "$warren_bin")"* ]] || continue
    tr '\0' ' ' <"$d/cmdline" 2>/dev/null | grep -qF -- "--state-dir $warren_state " && echo -n "${d#/proc/} "
  done
  return 0
}

# Starts warrend and makes sure the base layer exists; 0 when ready.
start_warrend() {
  mkdir -p "$warren_state"
  if [[ -n $(warrend_strays) ]]; then
    echo "run_baselines: a warrend is already running on $warren_state (pids $(warrend_strays))" >&2
    return 1
  fi
  nice -n "$nice_n" "$warren_bin" --state-dir "$warren_state" --socket "$warren_sock" \
    --layer-store "$warren_state/layers" --log-level warn >"$work/warrend.log" 2>&1 &
  warrend_pid=$!
  if ! PYTHONPATH=$root/sdk/python "$warren_py" - "unix:$warren_sock" "$warren_layer" "$rootfs" <<'PY'
import sys, time
import warren
addr, layer, rootfs = sys.argv[1:4]
client = warren.Client(addr)
for _ in range(600):  # up within 60 s or fail
    try:
        client.status(timeout=1)
        break
    except warren.WarrenError:
        time.sleep(0.1)
else:
    sys.exit("warrend did not come up")
try:
    client.layers.get(layer)
except warren.NotFound:
    client.layers.build(layer, dir=rootfs, timeout=900)
PY
  then
    echo "run_baselines: warrend set-up failed; its log ($cache/warrend.log):" >&2
    cp "$work/warrend.log" "$cache/warrend.log" 2>/dev/null || true
    tail -n 20 "$work/warrend.log" >&2 || true
    stop_warrend
    return 1
  fi
}

# Stops warrend and reports (and removes) what it left behind.
finish_warrend() {
  stop_warrend
  cp "$work/warrend.log" "$cache/warrend.log" 2>/dev/null || true
  # warrend processes of ours still alive after the daemon stopped (forked
  # helpers); they would hold the state dir's lock. Ended by pid.
  local strays
  strays=$(warrend_strays)
  if [[ -n $strays ]]; then
    warren_note="warrend left process(es) ${strays% } running after SIGTERM (ended by the bench). "
    kill -KILL $strays 2>/dev/null || true
  fi
  # warrend keeps its layer mounts across a restart (sandboxes outlive the
  # daemon). Every sandbox of ours was destroyed, so once no sandbox record
  # is left they are unused: say so and unmount them.
  local left m
  left=$(grep -F " $warren_state/" /proc/self/mountinfo | awk '{print $5}' || true)
  if [[ -n $left ]]; then
    if [[ -z $(ls -A "$warren_state/sandboxes" 2>/dev/null) ]]; then
      warren_note+="warrend left $(printf '%s\n' "$left" | wc -l) layer mount(s) under its state dir after SIGTERM with no sandbox left; the bench unmounted them"
      for m in $left; do umount "$m" || umount -l "$m"; done
    else
      warren_note+="warrend left sandboxes behind: $(ls "$warren_state/sandboxes" | tr '\n' ' ')"
    fi
  fi
  [[ -n $warren_note ]] && echo "run_baselines: $warren_note" >&2
  return 0
}

row_warren() {  # row_warren CONCURRENCY
  PYTHONPATH=$root/sdk/python run_row "warren_c$1" "$warren_py" "$bench/warren_loop.py" \
    --addr "unix:$warren_sock" --layer "$warren_layer" --concurrency "$1" --iterations "$n_round" \
    --max-seconds "$s_round"
}
row_warren_c1() { row_warren 1; }
row_warren_c16() { row_warren 16; }
row_warren_c64() { row_warren 64; }

if ((warren_rows)) && { want warren_c1 || want warren_c16 || want warren_c64; }; then
  if [[ ! -x $warren_bin ]]; then
    echo "run_baselines: warren rows skipped: $warren_bin not built" >&2
  elif warren_ran=1; start_warrend; then
    add_row warren_c1
    add_row warren_c16
    add_row warren_c64
  else
    for c in 1 16 64; do want "warren_c$c" && skip_row "warren_c$c" "warrend set-up failed"; done
    failed=1
  fi
fi

# ---------------------------------------------------------------- rounds
n_round=$(((iters + rounds - 1) / rounds))
s_round=$(((max_s + rounds - 1) / rounds))
for ((round = 1; round <= rounds; round++)); do
  for r in "${rows[@]}"; do "row_$r"; done
done
[[ -n $warrend_pid ]] && finish_warrend

# ---------------------------------------------------------------- report
umount "$lower"
remove_bench_cgroups
after=$(snapshot | grep -v "$work" || true)
leaks=$(comm -13 <(printf '%s\n' "$before" | sort) <(printf '%s\n' "$after" | sort) | sed '/^$/d')
if grep -qF " $lower " /proc/self/mountinfo; then leaks+=$'\n'"mount $lower (lower still mounted)"; fi
if grep -qF " $warren_state/" /proc/self/mountinfo; then leaks+=$'\n'"mounts under $warren_state"; fi
leaks=$(printf '%s\n' "$leaks" | sed '/^$/d')

versions="kernel $(uname -r), nproc $(nproc), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
tools=""
command -v bwrap >/dev/null && tools+="$(bwrap --version); "
command -v crun >/dev/null && tools+="crun $(crun --version | awk 'NR==1{print $3}'); "
command -v runc >/dev/null && tools+="runc $(runc --version | awk 'NR==1{print $3}'); "
tools+="erofs-utils $(dpkg-query -W -f '${Version}' erofs-utils 2>/dev/null || echo '?')"

# Merge each row's rounds: rate = all iterations / all timed seconds,
# percentiles over all samples; a row with a failed round is FAILED.
table=$(python3 - "$work/rounds.jsonl" "$work/skipped.jsonl" "$work/samples" <<'PY'
import json, os, sys
rounds = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
skipped = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
order, rows = [], {}
for r in rounds:
    if r["name"] not in rows:
        order.append(r["name"])
        rows[r["name"]] = {"name": r["name"], "ok": True, "iterations": 0, "seconds": 0.0,
                           "retries": 0, "round_rates": []}
    m = rows[r["name"]]
    if not r.get("ok"):
        m["ok"] = False
        continue
    m["iterations"] += r["iterations"]
    m["seconds"] += r["seconds"]
    m["retries"] += r.get("retries", 0)
    m["round_rates"].append(r["rate"])
    if "create_p50_us" in r:
        m.setdefault("create", []).append((r["create_p50_us"], r["create_p99_us"]))

def pct(xs, q):
    return xs[max(0, min(len(xs) - 1, int(q * (len(xs) - 1) + 0.5)))]

for m in rows.values():
    path = os.path.join(sys.argv[3], m["name"])
    xs = sorted(float(l) for l in open(path)) if os.path.exists(path) else []
    if m["ok"] and xs and m["seconds"] > 0:
        m.update(rate=m["iterations"] / m["seconds"], p50_us=pct(xs, .5), p90_us=pct(xs, .9),
                 p99_us=pct(xs, .99))
    else:
        m["ok"] = False
floor = rows.get("raw_floor") if rows.get("raw_floor", {}).get("ok") else None
print("| row | n | rate /s | p50 ms | p90 ms | p99 ms | rate / floor | p50 / floor | rate per round |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
for m in [rows[n] for n in order] + skipped:
    if not m.get("ok"):
        why = m.get("skipped") or "FAILED"
        print(f"| {m['name']} | - | - | - | - | - | - | - | {why} |")
        continue
    rr = f"{m['rate'] / floor['rate']:.2f}" if floor else "-"
    pr = f"{m['p50_us'] / floor['p50_us']:.2f}" if floor else "-"
    extra = f" (retries {m['retries']})" if m["retries"] else ""
    per = " / ".join(f"{x:.0f}" for x in m["round_rates"])
    print(f"| {m['name']}{extra} | {m['iterations']} | {m['rate']:.1f} | {m['p50_us'] / 1e3:.2f} | "
          f"{m['p90_us'] / 1e3:.2f} | {m['p99_us'] / 1e3:.2f} | {rr} | {pr} | {per} |")
notes = [m for m in (rows[n] for n in order) if m.get("ok") and m.get("create")]
if notes:
    print()
    for m in notes:
        per = " / ".join(f"{a / 1e3:.2f}, {b / 1e3:.2f}" for a, b in m["create"])
        print(f"- {m['name']}: the create RPC alone, p50, p99 ms per round: {per}")
PY
)

report="## $(date -u '+%Y-%m-%d %H:%M UTC') — $(hostname)

- command: \`$cmdline\` (nice $nice_n; per row $iters iterations or ${max_s} s, in $rounds interleaved rounds; one sandbox at a time except warren_cN)
- machine: $versions; load average before/after: $load_before / $(cut -d' ' -f1-3 /proc/loadavg)
- tools: $tools
- lower: $image ($(($(stat -c %s "$image") >> 20)) MiB, from $rootfs), $lower_how
${warren_ran:+- warrend: $warren_bin (built $(date -u -r "$warren_bin" '+%Y-%m-%d %H:%M UTC'))
}${warren_note:+- warren: $warren_note
}- leak check (mounts, temp dirs, cgroups, runtime state, loop devices): $([[ -z $leaks ]] && echo clean || echo "LEFT BEHIND: $(echo "$leaks" | tr '\n' ';')")

$table
"
printf '%s\n' "$report"
if ((record)); then
  printf '\n%s' "$report" >>"$bench/RESULTS.md"
  echo "run_baselines: appended to $bench/RESULTS.md" >&2
fi
if [[ -n $leaks ]]; then
  echo "run_baselines: left behind:" >&2
  printf '  %s\n' "$leaks" >&2
  exit 3
fi
exit $failed

#!/usr/bin/env bash
# The CPU calibration of docs/evidence.md section 5, continued session after session on whatever
# machine a session is given (its processes end with the session and its disk may be a new one):
#   start   on a CPU kind that has an experiment (below): a frozen worktree of the plan's commit, the
#           experiment's committed state restored under RUNS, then, niced in its own autogroup (nice 19)
#           and detached, `bench/gpu_calibration.sh --cpu` and, once it has decided, unless another
#           experiment's committed state holds a decision already (the first to decide decides),
#           `bench/second_search.sh` on the same root; it refuses to start twice. `start --smoke`:
#           the same chain in the smoke modes on digits (about 3 minutes), on any CPU
#   status  the cells journaled and in progress, the runner's process and its autogroup's nice
#   pause   SIGSTOP to every process of the runner's session (before a timed benchmark or CI run; its
#           steps run under `timeout`, which gives each its own process group); cont: SIGCONT
#   save    the root's journals, reports and logs, and the second search's folder (not checkpoints or
#           locks), into docs/evidence-runs/NAME and search2-NAME of this checkout, to commit
# Experiments, one per CPU kind (a kind's cells never pair with another's; evidence.md section 5):
#   'AMD EPYC; torch AVX2; refimpl avx2', LLVM's znver3                            -> calibration-cpu
#   'Intel(R) Xeon(R) Processor; torch AVX512; refimpl avx512-vpopcntdq', emeraldrapids -> calibration-cpu-xeon
# Needs Fashion-MNIST's IDX files (Debian: apt-get install dataset-fashion-mnist) and this checkout's
# .venv. RUNS (default /work/runs) and FROZEN (default /work/frozen-cal) are outside the checkout.
#
#   bash bench/calibration_runner.sh start      # at a session's start (and `save` then a commit at its end)
#   bash bench/calibration_runner.sh status
set -u
case "${1:-}" in
  -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;;  # the header above, without its #
  start|status|pause|cont|save|chain) ;;
  *) echo "error: unknown command '${1:-}'; give start, status, pause, cont or save" >&2; exit 2 ;;
esac
MAIN=$(cd "$(dirname "$0")/.." && pwd)
RUNS=${RUNS:-/work/runs}
FROZEN=${FROZEN:-/work/frozen-cal}
PLAN_COMMIT=67335a9  # the tree every cell of both CPU experiments trained with
PY=${PYTHON:-$MAIN/.venv/bin/python}
DATA=${BNN_DATA_DIR:-/usr/share/datasets/fashion-mnist}

# The grid's kind, and LLVM's name of the core: Xeons of two generations share the first (the
# development host's `rocketlake`, this experiment's `emeraldrapids`), and torch may block its
# kernels differently on each.
kind=$(cd "$MAIN" && "$PY" -c 'from bnn.train.host import cpu_kind, host_info; print(cpu_kind(host_info("cpu")))
import llvmlite.binding as b; print(b.get_host_cpu_name())' | paste -sd '|') || exit 2
case "$kind" in
  "AMD EPYC; torch AVX2; refimpl avx2|znver3") name=calibration-cpu ;;
  "Intel(R) Xeon(R) Processor; torch AVX512; refimpl avx512-vpopcntdq|emeraldrapids") name=calibration-cpu-xeon ;;
  *) name= ;;
esac
cal_mode=--cpu s2_mode=
if [ "${1:-}" = start ] && [ "${2:-}" = --smoke ]; then
  name=calibration-smoke cal_mode=--cpu-smoke s2_mode=--smoke
fi
root=$RUNS/$name
search=$RUNS/search2-$name
pidfile=$RUNS/$name.pid
running() { [ -n "$name" ] && [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }
need_kind() {
  [ -n "$name" ] && return
  echo "error: no calibration runs on this CPU kind ($kind); docs/evidence.md section 5 names the kinds" >&2
  exit 2
}

case "${1:-}" in
  start)
    need_kind
    if running; then echo "already running (pid $(cat "$pidfile")), root $root"; exit 0; fi
    if [ -z "$s2_mode" ] && [ ! -f "$DATA/train-images-idx3-ubyte.gz" ] && [ ! -f "$DATA/train-images-idx3-ubyte" ]; then
      echo "error: no Fashion-MNIST in $DATA; apt-get install dataset-fashion-mnist, or set BNN_DATA_DIR" >&2
      exit 2
    fi
    if [ ! -d "$FROZEN" ]; then
      git -C "$MAIN" worktree prune
      git -C "$MAIN" worktree add --detach "$FROZEN" "$PLAN_COMMIT" > /dev/null || exit 2
    fi
    [ "$(git -C "$FROZEN" rev-parse --short=7 HEAD)" = "$PLAN_COMMIT" ] \
      || { echo "error: $FROZEN is not at $PLAN_COMMIT; remove it or set FROZEN" >&2; exit 2; }
    mkdir -p "$FROZEN/data" "$root" && ln -sfn "$DATA" "$FROZEN/data/fashion-mnist"
    saved=$MAIN/docs/evidence-runs/$name
    if [ -z "$s2_mode" ] && [ ! -f "$root/full/journal.jsonl" ] && [ -f "$saved/full/journal.jsonl" ]; then
      cp -r "$saved/." "$root/" && echo "restored the committed state of $saved"
    fi
    if [ -z "$s2_mode" ] && [ ! -d "$search" ] && [ -d "$MAIN/docs/evidence-runs/search2-$name" ]; then
      cp -r "$MAIN/docs/evidence-runs/search2-$name" "$search" && echo "restored the second search's state"
    fi
    # Its own session (setsid) and autogroup at nice 19: a suite or benchmark beside it keeps its cores.
    CAL_MODE=$cal_mode S2_MODE=$s2_mode setsid nohup bash "$0" chain "$name" >> "$RUNS/$name.log" 2>&1 < /dev/null &
    echo $! > "$pidfile"
    echo "started (pid $!, $kind), root $root, log $RUNS/$name.log"
    ;;
  chain)  # started by `start` in its own session: the calibration, then the second search where it decides
    name=$2 root=$RUNS/$2 search=$RUNS/search2-$2
    echo 19 > /proc/self/autogroup
    cd "$FROZEN" || exit 2
    export PYTHONPATH=$FROZEN PYTHON=$PY CAL_ROOT=$root SEARCH_DIR=$search OMP_WAIT_POLICY=PASSIVE OUT=$RUNS/out-$name
    # Once decided, the calibration is closed: run again, its ladder would take the second search's
    # finds (new measures in the grid) as measures to calibrate.
    if grep -q '"decision"' "$root/logs/calibrate.out" 2>/dev/null; then
      echo "the calibration decided before ($root/logs/calibrate.out): on to the second search"
    else
      nice -n 19 bash bench/gpu_calibration.sh "$CAL_MODE" || exit $?
    fi
    first=$(for f in "$MAIN"/docs/evidence-runs/calibration-*/logs/calibrate.out; do
      case "$f" in */"$name"/*) continue ;; esac
      grep -q '"decision"' "$f" 2>/dev/null && basename "$(dirname "$(dirname "$f")")"
    done | head -1)
    if [ -n "$first" ]; then
      echo "$first decided first (its committed calibrate.out): no second search on $name (evidence.md section 5)"
      exit 0
    fi
    nice -n 19 bash bench/second_search.sh $S2_MODE
    ;;
  status)
    need_kind
    echo "kind: $kind -> $name"
    if running; then
      pid=$(cat "$pidfile")
      echo "runner: pid $pid, state $(ps -o stat= -p "$pid"), autogroup: $(cat "/proc/$pid/autogroup")"
    else
      echo "runner: not running"
    fi
    if [ -f "$root/full/journal.jsonl" ]; then
      "$PY" - "$root/full/journal.jsonl" <<'EOF'
import json, sys
rows = []
for line in open(sys.argv[1]):
    try:
        rows.append(json.loads(line))
    except ValueError:
        pass
cells = {r["key"]: r for r in rows if isinstance(r, dict) and "key" in r}.values()  # the last line of a key wins
print(f"{len(cells)} of 96 cells journaled: " + ", ".join(sorted({r['measure'] + '/' + r['counts'] for r in cells})))
cpu = sorted(r["cpu_s"] for r in cells if r.get("status") == "ok" and isinstance(r.get("cpu_s"), (int, float)))
if cpu and len(cells) < 96:  # two trainings at a time, one core each
    median = cpu[len(cpu) // 2]
    print(f"grid: {96 - len(cells)} cells left, about {(96 - len(cells)) * median / 2 / 3600:.1f} h with both cores "
          f"to the runner (median {median:.0f} s of CPU a finished cell); then the ladder")
EOF
      ls "$root/full/cells" 2>/dev/null | sed 's/^/in progress: /'
    fi
    ;;
  pause|cont)
    need_kind
    running || { echo "runner: not running"; exit 0; }
    sig=STOP; [ "$1" = cont ] && sig=CONT
    pkill -"$sig" -s "$(cat "$pidfile")" && echo "runner: SIG$sig sent to session $(cat "$pidfile")"
    ;;
  save)
    need_kind
    [ -f "$root/full/journal.jsonl" ] || { echo "error: nothing to save under $root" >&2; exit 2; }
    mkdir -p "$MAIN/docs/evidence-runs/$name"
    tar -C "$root" --exclude=lock --exclude=cells --exclude='*.pt' -cf - . \
      | tar -C "$MAIN/docs/evidence-runs/$name" -xf - && echo "saved $root into docs/evidence-runs/$name"
    if [ -d "$search" ]; then
      mkdir -p "$MAIN/docs/evidence-runs/search2-$name"
      tar -C "$search" --exclude=lock --exclude='*.pt' -cf - . \
        | tar -C "$MAIN/docs/evidence-runs/search2-$name" -xf - && echo "saved $search into docs/evidence-runs/search2-$name"
    fi
    ;;
esac

#!/usr/bin/env bash
# Issue 39 item 2 on one GPU: which fitness design ranks measures as the full recipe does
# (docs/evidence.md section 5 holds the plan, fixed before any of its results). Two journaled steps,
# each continued where the last session stopped, all on one kind of GPU:
#   full       the full recipe (bnn.evidence: mnist_net, all 55,000 Fashion-MNIST training images,
#              6 epochs, Adam 5e-3 x0.2 after epochs 4 and 5) for 16 measures on seeds 0-5, JOBS at once
#   calibrate  bnn.search.calibrate, CAL_WORKERS trainings at once (default 8 on a GPU, as
#              the grid's JOBS: a cost is wall time, read under the same sharing): every measure of that
#              grid and XNOR on each rung of the ladder, then every design's Spearman rho against the
#              grid's test means, its bootstrap interval, its top-3 agreement and its cost
# then three files in $OUT (the device tool brings back 8 at most): calibration-gpu.tgz (GPU mode only; both journals,
# reports and every step's output in ROOT/logs: unpack it over docs/evidence-runs and commit it, below),
# calibration-steps.tsv and summary.txt. Offline, with the machine's python3; installs nothing. After a GPU
# session, commit its state where the next one starts from:
#   tar xzf calibration-gpu.tgz -C docs/evidence-runs --exclude=calibration-gpu/full/lock
#
#   bash bench/gpu_calibration.sh               # on the GPU machine; needs data/fashion-mnist
#   bash bench/gpu_calibration.sh --cpu         # the same plan on this CPU (the plan's fallback, about 16 h
#                                               # of a quiet 2-core host: JOBS=2 cells of one thread each)
#   bash bench/gpu_calibration.sh --cpu-smoke   # here: the same two steps on digits, tiny (under 3 minutes)
#
# The device tool runs one command for at most 600 s, so this runs as its own call after
# bench/gpu_session.sh, e.g. run(command="bash bench/gpu_calibration.sh", carry=["data/fashion-mnist"]) with
# the four IDX files of Fashion-MNIST in data/fashion-mnist (Debian's dataset-fashion-mnist:
# /usr/share/datasets/fashion-mnist, 30 MB); it continues the committed state. BUDGET_S (default 300) bounds
# the whole run. mnist_net's layers under the Triton measure match their eager twins
# (tests/test_gpu_measure_op.py, under Triton's interpreter here and on the GPU in bench/gpu_session.sh's tests
# step). On 2026-11-28 one H200 ran the 12 raw cells in 101 s and 49 of the 78 laplace cells in 294 s (8 at once),
# as the second of two calls on one warm machine: gpu_session.sh with BUDGET_S=370 (timeout_s 430), then this
# with BUDGET_S=395 (timeout_s 450) issued within the machine's 30 s warm window: 803 s of a 900 s lease.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-./gpu_out}
PY=${PYTHON:-python3}
ROOT=${CAL_ROOT:-runs/calibration-gpu}
mode=gpu
case "${1:-}" in
  -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;;  # the header above, without its #
  --cpu-smoke) mode=smoke ;;
  --cpu) mode=cpu ;;
  "") ;;
  *) echo "error: unknown option '$1'; give --cpu, --cpu-smoke or nothing" >&2; exit 2 ;;
esac
SEARCH="16-4-4-12-10-4-2,16-17-4-12-10-4-2,16-7-11-12-1-12-2"  # the first search's three best (README)
if [ "$mode" != smoke ]; then
  dir=${BNN_DATA_DIR:-data/fashion-mnist}
  data=(--dataset fashion-mnist --data-dir "$dir")
  laplace="M1,M2,M3,M4,M5,M6,M7,M8,M9,M10,$SEARCH"
  rungs="2:5000,3:15000:2,4:30000:2"
  if [ "$mode" = gpu ]; then
    budget=${BUDGET_S:-300}
    common=(--device cuda --measure-impl "${MEASURE_IMPL:-triton}")  # eager: the plan's fallback (evidence.md section 5)
    grid=(--train-size 0 --epochs 6 --milestones 4,5 --seeds 0,1,2,3,4,5 --jobs "${JOBS:-8}")
    workers=${CAL_WORKERS:-8}  # as many at once as the grid's cells: a training's wall time is its cost
  else
    # One torch thread per training, as the replication's cells: a CPU training's bits depend on its
    # thread count (evidence.md section 4). Run it niced in its own autogroup (evidence.md section 4).
    export OMP_NUM_THREADS=1
    budget=${BUDGET_S:-864000}
    ROOT=${CAL_ROOT:-runs/calibration-cpu}
    common=(--device cpu --measure-impl eager)
    grid=(--train-size 0 --epochs 6 --milestones 4,5 --seeds 0,1,2,3,4,5 --jobs "${JOBS:-2}")
    workers=${CAL_WORKERS:-2}
  fi
  if [ ! -f "$dir/train-images-idx3-ubyte.gz" ] && [ ! -f "$dir/train-images-idx3-ubyte" ]; then
    echo "error: no Fashion-MNIST in $dir; carry data/fashion-mnist (its four IDX files) or set BNN_DATA_DIR" >&2
    exit 2
  fi
else
  budget=${BUDGET_S:-175}
  ROOT=${CAL_ROOT:-$OUT/calibration-smoke}
  data=(--dataset digits)
  common=(--device cpu --measure-impl eager)
  grid=(--epochs 1 --seeds 0,1 --jobs 2)
  laplace="M6,M7,16-7-11-12-1-12-2"
  rungs="1:200,1:400:2"
  workers=2
fi
# A fresh device runs nothing else: a lock carried from the last machine names a process of that one.
# (On this CPU the lock stays: it is the kernel's, gone with its process, and deleting the file under a
# running grid would let a second one lock a second file of the same name: bnn/common/runlock.py.)
[ "$mode" = gpu ] && rm -f "$ROOT/full/lock"
# The state of the last session is committed (docs/evidence-runs/calibration-gpu or -cpu): a fresh machine
# continues it (on the CPU, only a machine of the same kind: the grid refuses to pair two kinds).
SAVED=docs/evidence-runs/$(basename "$ROOT")
if [ "$mode" != smoke ] && [ ! -f "$ROOT/full/journal.jsonl" ] && [ -f "$SAVED/full/journal.jsonl" ]; then
  mkdir -p "$ROOT" && cp -r "$SAVED/." "$ROOT/" && echo "continuing the committed state in $SAVED"
fi
if [ "$mode" = cpu ] && [ -f "$ROOT/full/journal.jsonl" ]; then  # one CPU kind per experiment (evidence.md section 5)
  "$PY" - "$ROOT/full/journal.jsonl" <<'EOF' || exit 2
import json, sys
from bnn.train.host import cpu_kind, host_info
here = cpu_kind(host_info("cpu"))
def row(line):
    try:
        return json.loads(line)
    except ValueError:
        return {}  # a torn last line: the grid cuts it off itself
rows = [r for r in map(row, open(sys.argv[1])) if isinstance(r, dict)]
other = sorted({r["cpu_kind"] for r in rows if isinstance(r.get("cpu_kind"), str)} - {here})
if other:
    sys.exit(f"error: {sys.argv[1]} holds cells trained on {other}, and this CPU is {here!r}; "
             "continue this experiment on that kind only, or give a new root with CAL_ROOT=...")
EOF
fi
mkdir -p "$OUT" "$ROOT/logs" || exit 2
OUT=$(cd "$OUT" && pwd)
LOGS=$(cd "$ROOT/logs" && pwd)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" OMP_WAIT_POLICY=PASSIVE
deadline=$(( $(date +%s) + budget ))
: > "$OUT/calibration-steps.tsv"

step() {  # step NAME COMMAND...: under the time left (none under 20 s), output appended to ROOT/logs/NAME.out and .err
  local name=$1 left t0 rc
  shift
  left=$(( deadline - $(date +%s) ))
  if [ "$left" -lt 20 ]; then
    printf '%s\tskipped\t0\n' "$name" >> "$OUT/calibration-steps.tsv"
    return
  fi
  echo "[$name] up to ${left} s: $*"
  t0=$(date +%s)
  timeout --kill-after=15 "$left" "$@" >> "$LOGS/$name.out" 2>> "$LOGS/$name.err"
  rc=$?
  printf '%s\t%s\t%d\n' "$name" "$rc" $(( $(date +%s) - t0 )) >> "$OUT/calibration-steps.tsv"
  echo "[$name] exit $rc after $(( $(date +%s) - t0 )) s"
}

E=("$PY" -m bnn.evidence "${data[@]}" "${common[@]}" "${grid[@]}" --root "$ROOT/full" --real-measures none
   --no-progress --no-plot)
step full-raw "${E[@]}" --counts raw --measures baseline,M6
step full-laplace "${E[@]}" --counts laplace --measures "$laplace"
step full-freq "${E[@]}" --counts freq --measures M6
# A step stopped by its timeout journaled its finished cells but wrote no report: rebuild it.
step full-report "${E[@]}" --table-only
step calibrate "$PY" -m bnn.search.calibrate --full "$ROOT/full" --rungs "$rungs" "${data[@]}" "${common[@]}" \
  --workers "$workers" --out "$ROOT/ladder" --json

{
  echo "mode $mode, budget ${budget} s, root $ROOT"
  cat "$OUT/calibration-steps.tsv"
  grep -h "cells already finished" "$LOGS"/full-*.err | tail -6
  [ -f "$ROOT/full/results.md" ] && sed -n '/^| measure/,/^$/p' "$ROOT/full/results.md"
  [ -f "$LOGS/calibrate.out" ] && grep -v '^{' "$LOGS/calibrate.out" | tail -12
} > "$OUT/summary.txt" 2>&1
[ "$mode" = gpu ] && tar czf "$OUT/calibration-gpu.tgz" -C "$(dirname "$ROOT")" "$(basename "$ROOT")"
cat "$OUT/summary.txt"
! grep -qvP '\t0\t' "$OUT/calibration-steps.tsv"

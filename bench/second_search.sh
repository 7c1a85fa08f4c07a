#!/usr/bin/env bash
# Issue 39 item 3 on this CPU: the second search with the fitness design the calibration chose, then its
# three best retrained with the full recipe beside the calibration's XNOR cells, and the verdict. Every
# step and setting is the plan of docs/evidence.md section 5 ("Then the second search"), fixed before
# the calibration had a result; each step is journaled and continues where the last run stopped:
#   search   python -m bnn.search on Fashion-MNIST under laplace with the decision's flags (its
#            "Search with it" line; Algorithm 1's fitness as the first search ran it when the decision
#            kept it), GA seed 2 (the first search's was 1), 90 minutes of wall time per process (the
#            first search ran 30.5), niced two workers of one torch thread each, resumed when journaled
#   retrain  its three best members other than XNOR, full recipe on seeds 0-5, in the calibration's
#            grid (CAL_ROOT/full), where XNOR's cells of the same CPU kind already are
#   verdict  the grid's table with three comparisons in the family (Bonferroni, --family 3)
#
#   bash bench/second_search.sh            # after `bash bench/gpu_calibration.sh --cpu` printed its decision
#   bash bench/second_search.sh --smoke    # the same steps on digits, tiny, after gpu_calibration.sh --cpu-smoke
#
# CAL_ROOT (default runs/calibration-cpu; with --smoke, $OUT/calibration-smoke) holds the calibration:
# logs/calibrate.out's last JSON line is its decision. SEARCH_DIR (default runs/search2-fm-laplace) is
# the search's folder. Run it as the calibration runs (its own session, niced, OMP_WAIT_POLICY=PASSIVE).
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-./gpu_out}
mode=full
case "${1:-}" in
  -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;;  # the header above, without its #
  --smoke) mode=smoke ;;
  "") ;;
  *) echo "error: unknown option '$1'; give --smoke or nothing" >&2; exit 2 ;;
esac
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE  # one torch thread per training, as every cell of the grid
if [ "$mode" = full ]; then
  CAL=${CAL_ROOT:-runs/calibration-cpu}
  RUN=${SEARCH_DIR:-runs/search2-fm-laplace}
  dir=${BNN_DATA_DIR:-data/fashion-mnist}
  data=(--dataset fashion-mnist --data-dir "$dir")
  search=(--population 16 --seed 2 --thresholds 0.3,0.5 --threshold-steps 0,48 --max-evaluations 1000000
          --max-trainings 1000000 --workers-per-device 2)
  minutes=90
  algorithm1=(--train-size 5000 --epochs 2 --train-seed 100)  # the first search's fitness (section 2)
  grid=(--train-size 0 --epochs 6 --milestones 4,5 --seeds 0,1,2,3,4,5 --jobs 2)
  if [ ! -f "$dir/train-images-idx3-ubyte.gz" ] && [ ! -f "$dir/train-images-idx3-ubyte" ]; then
    echo "error: no Fashion-MNIST in $dir; set BNN_DATA_DIR to the folder of its four IDX files" >&2
    exit 2
  fi
else
  CAL=${CAL_ROOT:-$OUT/calibration-smoke}
  RUN=${SEARCH_DIR:-$OUT/search2-smoke}
  data=(--dataset digits)
  search=(--population 4 --seed 2 --thresholds 0 --threshold-steps 0 --max-evaluations 8 --max-trainings 1000
          --workers-per-device 2)
  minutes=3
  algorithm1=(--train-size 200 --epochs 1 --train-seed 100)
  grid=(--epochs 1 --seeds 0,1 --jobs 2)  # as gpu_calibration.sh --cpu-smoke's grid
fi
common=(--device cpu --measure-impl eager)

# The decision, refused before anything is written when the calibration has none.
flags=$("$PY" - "$CAL/logs/calibrate.out" <<'EOF'
import json, sys
try:
    lines = [line for line in open(sys.argv[1]) if line.startswith("{")]
    decision = json.loads(lines[-1])["decision"]
except (OSError, IndexError, ValueError, KeyError, TypeError):
    sys.exit(f"error: no decision in {sys.argv[1]}; run bash bench/gpu_calibration.sh --cpu (or --cpu-smoke) "
             "to its end first, or set CAL_ROOT to the calibration's folder")
print(" ".join(decision["search_flags"]))
EOF
) || exit 2
if [ -z "$flags" ]; then
  design=("${algorithm1[@]}")
  echo "decision: Algorithm 1's fitness stays; the second search runs it as the first did: ${design[*]}"
else
  read -r -a design <<< "$flags"
  echo "decision: python -m bnn.search ${design[*]}"
fi

# 1. The search (resumed while its journal has no end).
last=$(tail -n 1 "$RUN/journal.jsonl" 2>/dev/null | "$PY" -c 'import json, sys; print(json.loads(sys.stdin.read() or "{}").get("type"))' 2>/dev/null)
if [ "$last" = end ]; then
  echo "[search] finished before: $RUN"
elif [ -f "$RUN/journal.jsonl" ]; then
  echo "[search] resuming $RUN"
  "$PY" -m bnn.search --resume "$RUN" --max-minutes "$minutes" --no-progress || exit $?
else
  echo "[search] $RUN"
  "$PY" -m bnn.search "${data[@]}" --counts laplace "${common[@]}" "${search[@]}" --max-minutes "$minutes" \
    "${design[@]}" --run-dir "$RUN" --no-progress || exit $?
fi

# 2. Its three best members other than XNOR, retrained with the full recipe in the calibration's grid.
top=$("$PY" - "$RUN/results.json" <<'EOF'
import json, sys
from refimpl.genome import PAPER_MEASURES, Genome
baseline = str(Genome.parse("baseline"))
found = []
for row in json.load(open(sys.argv[1]))["population"]:
    g = str(Genome.parse(row["genome"]))
    if g != baseline and g not in found:
        found.append(g)
if len(found) < 3:
    sys.exit(f"error: {sys.argv[1]} has {len(found)} members other than XNOR; the plan retrains three")
# A paper measure by its name, as the calibration's grid has it, so that its finished cells are reused.
names = {str(Genome.parse(g)): name for name, g in PAPER_MEASURES.items()}
print(",".join(names.get(g, g) for g in found[:3]))
EOF
) || exit 2
echo "[retrain] $top"
E=("$PY" -m bnn.evidence "${data[@]}" "${common[@]}" "${grid[@]}" --root "$CAL/full" --real-measures none
   --no-progress --no-plot)
"${E[@]}" --counts laplace --measures "$top" || exit $?

# 3. The verdict: every row of the grid, three comparisons in the family.
"${E[@]}" --table-only --family 3 || exit $?
echo "second search: $RUN; its three best: $top; the table: $CAL/full/results.md (three comparisons, Bonferroni)"

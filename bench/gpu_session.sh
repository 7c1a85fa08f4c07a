#!/usr/bin/env bash
# The one script a GPU session runs for issue 16: offline, with the machine's own python3 (installs
# nothing), in under 8 minutes on one H100 or H200. Every step runs under its own timeout, cut to
# the time left before the deadline (a step with under 20 s left is skipped), and writes
# $OUT/NAME.out and NAME.err; a bench stopped by its timeout leaves its numbers so far in NAME.err.
#
#   bash bench/gpu_session.sh               # on the GPU machine; OUT defaults to ./gpu_out
#   bash bench/gpu_session.sh --cpu-smoke   # here: the same steps at CPU smoke sizes (about 2 minutes)
#
# Steps, the most important first:
#   env     the GPU, driver, torch, CUDA, and that every import the steps need is there
#   counts  tests/test_gpu_counts.py: counts bit-identical to refimpl on every binary layer shape
#   best    bench_fitness.py --compile --measure-op --fused-adam, K = 1,2,4, beside the float ResNet-18
#   full    the same, one whole 15-epoch evaluation in a fresh process, compile included (inductor's
#           on-disk cache warmed by best, as a search worker's is after its first candidate)
#   graphs  the step as CUDA graphs (--compile --cudagraphs --fused-adam; bnn.train --step graphs), K = 1
#   eager   bench_fitness.py as shipped (eager), K = 1,4
#   today   bench_fitness.py --compile without the operator: what a new genome costs today
# then $OUT/summary.txt (and summary.json): each step's exit status and time, the numbers, and the
# four targets of the issue checked. Exit status 0 when every step ran and exited 0.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-./gpu_out}
PY=${PYTHON:-python3}
mode=gpu
case "${1:-}" in
  --cpu-smoke) mode=cpu ;;
  "") ;;
  *) echo "error: unknown option '$1'; give --cpu-smoke or nothing" >&2; exit 2 ;;
esac
if [ "$mode" = gpu ]; then budget=${BUDGET_S:-450}; else budget=${BUDGET_S:-240}; fi
mkdir -p "$OUT" || exit 2
deadline=$(( $(date +%s) + budget ))
: > "$OUT/steps.tsv"

step() {  # step NAME LIMIT_S COMMAND...
  local name=$1 limit=$2 left t0 rc ms
  shift 2
  left=$(( deadline - $(date +%s) ))
  if [ "$left" -lt 20 ]; then
    printf '%s\tskipped\t0\n' "$name" >> "$OUT/steps.tsv"
    echo "[$name] skipped: the session's time is spent"
    return
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "[$name] up to ${limit} s: $*"
  t0=$(date +%s%N)
  timeout --kill-after=10 "$limit" "$@" > "$OUT/$name.out" 2> "$OUT/$name.err"
  rc=$?
  ms=$(( ($(date +%s%N) - t0) / 1000000 ))
  printf '%s\t%s\t%d.%03d\n' "$name" "$rc" $((ms / 1000)) $((ms % 1000)) >> "$OUT/steps.tsv"
  echo "[$name] exit $rc after $((ms / 1000)) s"
}

env_report() {
  if [ "$mode" = gpu ]; then nvidia-smi || true; fi
  git rev-parse HEAD 2>/dev/null || echo "(no git here)"
  "$PY" - <<'EOF'
import platform, torch, numba, pytest
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda,
      "numba", numba.__version__, "pytest", pytest.__version__)
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("gpu", p.name, f"{p.total_memory / 2**30:.1f} GiB", "SMs", p.multi_processor_count)
import bnn.nn.measure_op, bnn.train.loop, refimpl.isa  # what the other steps import
print("imports ok; refimpl kernel path:", refimpl.isa.current_path())
EOF
}

export -f env_report
export mode PY
BF=(bench/bench_fitness.py --json)
if [ "$mode" = gpu ]; then
  step env 60 bash -c env_report
  step counts 120 "$PY" -m pytest tests/test_gpu_counts.py -q -p no:cacheprovider
  step best 240 "$PY" "${BF[@]}" --device cuda --compile --measure-op --fused-adam --k 1,2,4
  step full 150 "$PY" "${BF[@]}" --device cuda --compile --measure-op --fused-adam --full-only
  step graphs 90 "$PY" "${BF[@]}" --device cuda --compile --cudagraphs --fused-adam --no-float --k 1
  step eager 90 "$PY" "${BF[@]}" --device cuda --k 1,4
  step today 120 "$PY" "${BF[@]}" --device cuda --compile --no-float --k none
else
  # aot_eager: TorchDynamo and AOTAutograd as on the GPU, without inductor's minutes of C++ on 2 cores.
  small=(--device cpu --tiny --compile-backend aot_eager)
  step env 60 bash -c env_report
  step counts 90 env BNN_COUNTS_DEVICE=cpu "$PY" -m pytest tests/test_gpu_counts.py -q -p no:cacheprovider \
    -k "benchmark-off and nchw"
  step best 120 "$PY" "${BF[@]}" "${small[@]}" --compile --measure-op --fused-adam --no-float --k 1
  step full 90 "$PY" "${BF[@]}" "${small[@]}" --images 12 --compile --measure-op --fused-adam --full-only
  step eager 60 "$PY" "${BF[@]}" "${small[@]}" --k 1,2
  step today 60 "$PY" "${BF[@]}" "${small[@]}" --compile --no-float --k none
fi

"$PY" - "$OUT" "$mode" <<'EOF' | tee "$OUT/summary.txt"
import json, pathlib, sys

out, mode = pathlib.Path(sys.argv[1]), sys.argv[2]
steps = [line.split("\t") for line in (out / "steps.tsv").read_text().splitlines()]
print(f"issue 16 GPU session ({'CPU smoke: sizes and numbers mean nothing' if mode == 'cpu' else 'GPU'})")
for name, rc, secs in steps:
    print(f"  {name:<7} exit {rc:<8} {secs:>8} s")


def load(name):
    # The bench's JSON line, or when a timeout stopped it, the last "progress" line it left on stderr.
    for suffix, prefix in ((".out", ""), (".err", "progress ")):
        try:
            lines = [ln[len(prefix):] for ln in (out / f"{name}{suffix}").read_text().splitlines() if ln.startswith(prefix + "{")]
            if lines:
                return {**json.loads(lines[-1]), "partial": suffix == ".err"}
        except (OSError, ValueError):
            pass
    return None


names = ("best", "full", "graphs", "eager", "today") if mode == "gpu" else ("best", "full", "eager", "today")  # no CUDA graphs on a CPU
runs = {name: load(name) for name in names}
status = {n: rc for n, rc, _ in steps}
for name, r in runs.items():
    if r is None:
        print(f"{name}: " + ("skipped: no time left" if status.get(name) == "skipped" else f"no result (see {name}.err)"))
        continue
    fs = {m: f"{v['first_genome']:.1f} s first, {v['new_genome']:.1f} s new genome" for m, v in r.get("first_step_s", {}).items()}
    flt = "" if r.get("float_images_per_s") is None else \
        f", float {r['float_images_per_s']:.0f}, binary/float {r['binary_vs_float']:.2f}x"
    if "full_evaluation" in r:
        f = r["full_evaluation"]
        print(f"{name}: whole evaluation {f['seconds']:.1f} s for {f['epochs_done']} of {f['epochs']} epochs "
              f"({f['steps']} steps, {f['train_images']} train / {f['val_images']} val images, last val acc "
              f"{f['last_val_acc']})")
    if "binary_images_per_s" not in r:
        if "full_evaluation" not in r:
            print(f"{name}: stopped early; first step: {fs}")
        continue
    print(f"{name}{' (stopped early)' if r['partial'] else ''}: {r['device_name']}, binary "
          f"{r['binary_images_per_s']:.0f} images/s{flt}; first step: {fs}; one evaluation {r['evaluation_s']:.1f} s extrapolated")
    for k in r["concurrent"]:
        print(f"  K={k['k']}: " + (k["error"] if "error" in k else
              f"{k['images_per_s']:.0f} images/s, {k['evaluations_per_hour']:.1f} evaluations/h "
              f"({k['evaluations_per_hour_incl_overhead']:.1f} with validation and set-up)"))

counts_rc = status.get("counts")
tail = (out / "counts.out").read_text().strip().splitlines()[-1:] if (out / "counts.out").exists() else []
counts_ok = counts_rc == "0" and bool(tail) and "passed" in tail[0] and "skipped" not in tail[0]
best = runs["best"] or {}
rates = [k for k in best.get("concurrent", []) if "error" not in k]
per_hour = max((k["evaluations_per_hour_incl_overhead"] for k in rates), default=None)
whole = (runs["full"] or {}).get("full_evaluation", {})
full = whole.get("seconds") if whole.get("epochs_done") == whole.get("epochs") else None  # finished runs only
targets = {
    "one 15-epoch evaluation <= 45 s (whole, compile and first step included)": (full, full is not None and full <= 45),
    "binary >= 0.7x float images/s": (best.get("binary_vs_float"), (best.get("binary_vs_float") or 0) >= 0.7),
    ">= 80 evaluations/hour per GPU, best K": (per_hour, (per_hour or 0) >= 80),
    "counts bit-identical to refimpl on every layer shape": (tail[0] if tail else None, counts_ok),
}
print("targets" + (" (CPU smoke: not measured)" if mode == "cpu" else "") + ":")
for what, (value, ok) in targets.items():
    shown = f"{value:.2f}" if isinstance(value, float) else value
    print(f"  {'MET ' if ok else 'NOT '} {what}: {shown}")
(out / "summary.json").write_text(json.dumps({"mode": mode, "steps": steps, "runs": runs,
                                              "targets": {k: {"value": v, "met": ok} for k, (v, ok) in targets.items()}}))
EOF
! grep -qv $'\t0\t' "$OUT/steps.tsv"

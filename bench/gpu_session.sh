#!/usr/bin/env bash
# The one script a GPU session runs for issue 37 (the Triton measure, the whole step as one CUDA graph):
# offline, with the machine's own python3 (installs nothing; its torch must bring triton), in under 8
# minutes on one H100 or H200. Every step runs under its own timeout, cut to the time left before the
# deadline (a step with under 20 s left is skipped), and writes $OUT/NAME.out and NAME.err; a bench
# stopped by its timeout leaves its numbers so far in NAME.err.
#
#   bash bench/gpu_session.sh               # on the GPU machine; OUT defaults to ./gpu_out
#   bash bench/gpu_session.sh --cpu-smoke   # here: every step on the CPU at smoke sizes (under 3 minutes)
#
# Steps, the most important first:
#   env     the GPU, driver, torch, CUDA, triton, and that every import the steps need is there
#   tests   tests/test_gpu_measure_triton.py, test_gpu_measure_op.py, test_gpu_relax.py, test_graph_step.py on CUDA: the compiled
#           kernels against refimpl and eager autograd, one graph for 20 genomes, the captured step replayed
#   graphs  bench_fitness.py --triton --graphs: binary and float ResNet-18 under the same step (the whole
#           step one CUDA graph), K = 2 processes beside the one measured alone, 2 and 4 models in this one
#           process on a CUDA stream each (processes take turns on the GPU; streams can overlap), a new
#           genome on the kept model to its first step
#   full    one whole 15-epoch evaluation of M6 under laplace (a measure that trains), timed as a search
#           worker's later candidate: from set_genome on a model whose first genome already stepped
#   search  python -m bnn.search on CIFAR-shaped data (random files in CIFAR-10's format when $BNN_DATA_DIR
#           has no CIFAR-10): it journals, is killed (SIGKILL) after its first result, resumes, prints its
#           leaderboard
#   profile bench/profile_step.py: the captured step's wall time against its kernels' time, and the kernels
#           that take it (binary M6 under laplace, the same with the inputs binarized unfused, float); before inductor, whose
#           compile took the last 41 s of a 370 s budget without a number (2026-11-28)
#   inductor the same step with torch.compile (inductor) under the capture: the elementwise work around
#           the measure operator fused (binary only)
# then $OUT/summary.txt (and summary.json): each step's exit status and time, the numbers, and the
# issue's targets checked. Exit status 0 when every step ran and exited 0.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-./gpu_out}
PY=${PYTHON:-python3}
mode=gpu
case "${1:-}" in
  -h|--help) sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0"; exit 0 ;;  # the header above, without its #
  --cpu-smoke) mode=cpu ;;
  "") ;;
  *) echo "error: unknown option '$1'; give --cpu-smoke or nothing" >&2; exit 2 ;;
esac
if [ "$mode" = gpu ]; then budget=${BUDGET_S:-470}; else budget=${BUDGET_S:-175}; fi
mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
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
import platform, torch, numba, pytest, triton
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda,
      "triton", triton.__version__, "numba", numba.__version__, "pytest", pytest.__version__)
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print("gpu", p.name, f"{p.total_memory / 2**30:.1f} GiB", "SMs", p.multi_processor_count)
import bnn.gpu.measure_op, bnn.train.graph_step, bnn.search.cli, refimpl.isa  # what the other steps import
print("imports ok; refimpl kernel path:", refimpl.isa.current_path())
EOF
}

search_e2e() {  # search_e2e DEVICE ARGS...: a search that journals, is killed, resumes, prints its leaderboard
  local device=$1 data=${BNN_DATA_DIR:-} run=$OUT/search pid
  shift
  if [ -z "$data" ] || { [ ! -d "$data/cifar-10-batches-py" ] && [ ! -f "$data/cifar-10-python.tar.gz" ]; }; then
    data=$OUT/cifar  # random images in CIFAR-10's own format: nothing downloads
    "$PY" -c "import sys; sys.path.insert(0, 'tests'); from _tiny_cifar import make_cifar
make_cifar(sys.argv[1], per_batch=int(sys.argv[2]), archive=False)" "$data" "$SEARCH_PER_BATCH" || return 1
    echo "random CIFAR-shaped data: $((5 * SEARCH_PER_BATCH)) training images in $data"
  fi
  rm -rf "$run"
  "$PY" -m bnn.search --dataset cifar10 --data-dir "$data" --device "$device" --run-dir "$run" --no-progress \
    --counts laplace --epochs 1 --seed 1 "$@" &
  pid=$!
  until grep -Eq '"type": ?"result"' "$run/journal.jsonl" 2>/dev/null || ! kill -0 "$pid" 2>/dev/null; do sleep 1; done
  kill -9 "$pid" 2>/dev/null && echo "killed the search (SIGKILL) after its first result"
  wait "$pid"
  echo "journal before the resume: $(grep -Ec '"type": ?"result"' "$run/journal.jsonl") result line(s)"
  "$PY" -m bnn.search --resume "$run" --no-progress
}

export -f env_report search_e2e
export mode PY OUT
BF=(bench/bench_fitness.py --json)
GT=(tests/test_gpu_measure_triton.py tests/test_gpu_measure_op.py tests/test_gpu_relax.py tests/test_graph_step.py)
if [ "$mode" = gpu ]; then
  export SEARCH_PER_BATCH=2000
  step env 30 bash -c env_report
  step tests 150 "$PY" -m pytest -q -p no:cacheprovider -W ignore::RuntimeWarning "${GT[@]}"
  step graphs 150 "$PY" "${BF[@]}" --device cuda --triton --graphs --k 2 --streams 2,4
  step full 120 "$PY" "${BF[@]}" --device cuda --triton --graphs --counts laplace --full-genome M6 --full-only
  step search 100 bash -c 'search_e2e "$@"' _ cuda --measure-impl triton --step graphs --train-size 5000 \
    --val-size 1000 --population 3 --max-evaluations 5
  step profile 75 "$PY" bench/profile_step.py --device cuda --networks M6:laplace,M6:laplace:unfused,float --top 12
  step inductor 100 "$PY" "${BF[@]}" --device cuda --triton --graphs --compile --no-float --k none
else
  # Triton's interpreter runs the tests (a few of them: it is slow); a ResNet-18 under it would take hours, so
  # the benches time the same step (GraphStep, uncaptured on a CPU) with the eager measure, and the search
  # trains a small network.
  export SEARCH_PER_BATCH=40 TRITON_INTERPRET=1
  step env 30 bash -c env_report
  step tests 70 "$PY" -m pytest -q -p no:cacheprovider -W ignore::RuntimeWarning "${GT[@]}" \
    -k "opcheck or host or plain_loop or refuse"
  step graphs 45 "$PY" "${BF[@]}" --device cpu --tiny --model mnist_net --graphs --images 12 --warmup 1 --steps 1 --k none \
    --streams 2
  step full 20 "$PY" "${BF[@]}" --device cpu --tiny --model mnist_net --graphs --images 12 --counts laplace \
    --full-genome M6 \
    --full-only --full-epochs 1
  step search 60 bash -c 'search_e2e "$@"' _ cpu --measure-impl eager --step eager --model mnist_net --train-size 32 \
    --val-size 16 --batch-size 16 --population 2 --max-evaluations 3
  step profile 30 "$PY" bench/profile_step.py --device cpu --tiny --networks M6:laplace,float --top 5
  step inductor 40 "$PY" "${BF[@]}" --device cpu --tiny --model mnist_net --graphs --compile --compile-backend aot_eager \
    --images 12 --warmup 1 --steps 1 --no-float --k none
fi

"$PY" - "$OUT" "$mode" <<'EOF' | tee "$OUT/summary.txt"
import json, pathlib, sys

out, mode = pathlib.Path(sys.argv[1]), sys.argv[2]
steps = [line.split("\t") for line in (out / "steps.tsv").read_text().splitlines()]
print(f"issue 37 GPU session ({'CPU smoke: sizes and numbers mean nothing' if mode == 'cpu' else 'GPU'})")
for name, rc, secs in steps:
    print(f"  {name:<9} exit {rc:<8} {secs:>8} s")


def load(name):
    # The bench's JSON line, or when a timeout stopped it, the last "progress" line it left on stderr.
    for suffix, prefix in ((".out", ""), (".err", "progress ")):
        try:
            lines = [ln[len(prefix):] for ln in (out / f"{name}{suffix}").read_text().splitlines() if ln.startswith(prefix + "{")]
            if lines:
                return {**json.loads(lines[-1]), "partial": suffix == ".err"}
        except (OSError, ValueError):
            pass
    return {}


def text(name):
    try:
        return (out / f"{name}.out").read_text()
    except OSError:
        return ""


status = {n: rc for n, rc, _ in steps}
graphs, whole, fused = load("graphs"), load("full").get("full_evaluation", {}), load("inductor")
if graphs.get("binary_images_per_s"):
    flt = graphs.get("float_images_per_s")
    print(f"graphs{' (stopped early)' if graphs['partial'] else ''}: {graphs['device_name']}, binary "
          f"{graphs['binary_images_per_s']:.0f} images/s" + (f", float {flt:.0f}, binary/float "
          f"{graphs['binary_vs_float']:.2f}x" if flt else "") + f"; first step {graphs['first_step_s']}; one "
          f"evaluation {graphs['evaluation_s']:.1f} s extrapolated")
    for k in graphs.get("concurrent", []):
        print(f"  K={k['k']}: " + (k["error"] if "error" in k else f"{k['images_per_s']:.0f} images/s, "
              f"{k['evaluations_per_hour_incl_overhead']:.1f} evaluations/h with validation and set-up"))
    for k in graphs.get("in_process", []):  # K models in one process, a CUDA stream each
        print(f"  {k['k']} in one process: " + (k["error"] if "error" in k else f"{k['images_per_s']:.0f} images/s, "
              f"{k['evaluations_per_hour_incl_overhead']:.1f} evaluations/h with validation and set-up"))
if fused.get("binary_images_per_s") and graphs.get("float_images_per_s"):
    print(f"inductor: binary {fused['binary_images_per_s']:.0f} images/s under the captured compiled step, "
          f"{fused['binary_images_per_s'] / graphs['float_images_per_s']:.2f}x the graphs step's float; first step "
          f"{fused.get('first_step_s')}")
if whole:
    print(f"full: {whole['genome']} {whole['seconds']:.1f} s for {whole['epochs_done']} of {whole['epochs']} epochs "
          f"({whole['steps']} steps), last val acc {whole['last_val_acc']}; clock {whole.get('clock', '?')}")
for line in text("profile").splitlines():
    if line.startswith("== "):
        print("profile: " + line[3:])
tests_tail = (text("tests").strip().splitlines() or [""])[-1]
search = text("search")
# K = 1 is the process measured alone (its extrapolated evaluation includes validation and set-up).
rates = [k["evaluations_per_hour_incl_overhead"] for k in graphs.get("concurrent", []) + graphs.get("in_process", [])
         if "error" not in k]
rates += [3600.0 / graphs["evaluation_s"]] if graphs.get("evaluation_s") else []
new_genome = graphs.get("first_step_s", {}).get("graphs", {}).get("new_genome")
full = whole.get("seconds") if whole and whole.get("epochs_done") == whole.get("epochs") else None
ratio = max([graphs.get("binary_vs_float") or 0.0] + ([fused["binary_images_per_s"] / graphs["float_images_per_s"]]
                                                       if fused.get("binary_images_per_s") and graphs.get("float_images_per_s")
                                                       else [])) or None
targets = {
    "GPU tests of bnn/gpu and the graph step pass": (
        tests_tail, status.get("tests") == "0" and "passed" in tests_tail and "failed" not in tests_tail),
    "binary >= 0.7x float images/s under the same step (goal 0.9x)": (ratio, (ratio or 0) >= 0.7),
    "one 15-epoch evaluation <= 60 s after the first genome, compile included (goal 30 s)": (
        full, full is not None and full <= 60),
    ">= 150 evaluations/hour per GPU, best K (goal 300)": (max(rates, default=None), max(rates, default=0) >= 150),
    "a new genome to its first step <= 1 s": (new_genome, new_genome is not None and new_genome <= 1.0),
    "search journals, is killed, resumes, prints its leaderboard": (
        status.get("search"), status.get("search") == "0" and "killed" in search and "best first" in search),
}
print("targets" + (" (CPU smoke: the numbers are not measured, the plumbing is)" if mode == "cpu" else "") + ":")
for what, (value, ok) in targets.items():
    shown = f"{value:.2f}" if isinstance(value, float) else value
    print(f"  {'MET ' if ok else 'NOT '} {what}: {shown}")
failed = [ln for ln in text("tests").splitlines() if ln.startswith(("FAILED ", "ERROR "))]
for line in failed:  # which tests, and the first lines of why, without unpacking the tarball
    print(f"  tests: {line[:300]}")
(out / "summary.json").write_text(json.dumps({"mode": mode, "steps": steps, "graphs": graphs, "full": whole,
                                              "targets": {k: {"value": v, "met": ok} for k, (v, ok) in targets.items()},
                                              "failed_tests": failed}))
EOF
! grep -qv $'\t0\t' "$OUT/steps.tsv"

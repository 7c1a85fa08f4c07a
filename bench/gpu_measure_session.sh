#!/usr/bin/env bash
# The GPU checks of bnn/gpu (issue 37 items 1, 2, 4) in one short script, offline, with the machine's own
# python3 (installs nothing; its torch must bring triton): about 3-5 minutes on one H100 or H200.
#
#   bash bench/gpu_measure_session.sh        # OUT defaults to ./gpu_out
#
#   env    the GPU, driver, torch, CUDA, triton, numba
#   bench  bench/bench_gpu_measure.py: one 64-channel 3x3 layer at batch 128, 32x32 (ResNet-18's first
#          stage): float conv, eager measure, Triton measure, per genome; set_genome to the first step
#   tests  tests/test_gpu_measure_triton.py and tests/test_gpu_measure_op.py on CUDA tensors: the compiled
#          kernels (libdevice's exp, div_rn) against refimpl, eager autograd, opcheck, one graph for 20 genomes
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-./gpu_out}
PY=${PYTHON:-python3}
mkdir -p "$OUT" || exit 2
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  "$PY" -c "import torch, triton, numba; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'numba', numba.__version__)"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
timeout 150 "$PY" bench/bench_gpu_measure.py --iters 10 > "$OUT/bench.txt" 2>&1
echo "bench rc=$?"; tail -8 "$OUT/bench.txt"
timeout 300 "$PY" -m pytest -q -p no:cacheprovider -W ignore::RuntimeWarning --durations=8 \
    tests/test_gpu_measure_triton.py tests/test_gpu_measure_op.py > "$OUT/tests.txt" 2>&1
rc=$?
echo "tests rc=$rc"; tail -30 "$OUT/tests.txt"
exit $rc

"""bnn/gpu's kernels round every float operation as refimpl and torch's autograd do: compiled for sm_90 (an H100
or H200) without a GPU, with the launchers' own options, their PTX holds no fused multiply-add. Triton contracts
a multiply feeding an add into one FMA by default (one rounding instead of two); the same forward kernel compiled
that way holds dozens, which shows the check sees them."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parents[1]


def test_no_kernel_contracts_a_multiply_and_an_add():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the compiler needs jitted functions
    env.update(PYTHONPATH=str(ROOT), TRITON_DEFAULT_FP_FUSION="1")  # Triton's default contraction, named
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "_ptx_probe.py")], capture_output=True, text=True,
                       env=env, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    counts = json.loads(r.stdout.strip().splitlines()[-1])
    default = counts.pop("measure_forward, Triton's default")
    assert default > 0, "the probe found no FMA where Triton's default contraction makes them: it cannot see any"
    assert len(counts) == 6 and counts == dict.fromkeys(counts, 0), counts

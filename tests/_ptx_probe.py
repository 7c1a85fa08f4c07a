"""Compiles bnn/gpu's Triton kernels for an H100/H200 (sm_90) without a GPU and prints, as one JSON line, how many
fused multiply-adds (``fma.rn.f32``) each one's PTX holds: with the launchers' options (``NO_CONTRACTION``) and,
for the forward, with Triton's default contraction, so the reader sees the count it guards against.

Run as a script with TRITON_INTERPRET unset (tests/test_gpu_ptx.py): under the interpreter the kernels' device
functions are plain Python, which the compiler cannot take.
"""
from __future__ import annotations

import json
import re

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from bnn.gpu import measure_kernels as K
from bnn.gpu import relax as R

INT_POINTERS = {"rows_ptr", "codes_ptr"}
FLOAT_SCALARS = {"limit", "clip"}


def signature(fn) -> dict[str, str]:
    """Triton's signature of ``fn`` for float32 tensors, int32 sizes and strides, constexprs as such."""
    sig = {}
    for param in fn.params:
        name = param.name
        if param.is_constexpr:
            sig[name] = "constexpr"
        elif name.endswith("_ptr"):
            sig[name] = "*i32" if name in INT_POINTERS else "*fp32"
        else:
            sig[name] = "fp32" if name in FLOAT_SCALARS else "i32"
    return sig


def fmas(fn, constexprs: dict, warps: int, **options) -> int:
    compiled = triton.compile(ASTSource(fn, signature(fn), constexprs=constexprs), target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": warps, **options})
    return len(re.findall(r"\bfma\.rn\.f32\b", compiled.asm["ptx"]))


def main() -> None:
    fwd = {"ROUND": True, "INTERP": False, "BO": 16, "BP": 128, "I64": False}
    bwd = {"CLIP": True, "ROUND": True, "INTERP": False, "BO": 16, "BP": 16, "I64": False}
    relax = {"BC": R.BLOCK_C, "BP": R.BLOCK_P, "I64": False}
    counts = {
        "measure_forward": fmas(K.measure_forward_kernel, fwd, K.FORWARD.warps, **K.NO_CONTRACTION),
        "measure_forward, Triton's default": fmas(K.measure_forward_kernel, fwd, K.FORWARD.warps),
        **{f"measure_backward, convention {c}": fmas(K.measure_backward_kernel, {**bwd, "CONV": c}, K.BACKWARD.warps,
                                                     **K.NO_CONTRACTION) for c in K.CONVENTION_CODES.values()},
        "relax_forward": fmas(R.relax_forward_kernel, relax, R.WARPS, **K.NO_CONTRACTION),
        "relax_backward": fmas(R.relax_backward_kernel, relax, R.WARPS, **K.NO_CONTRACTION),
    }
    print(json.dumps(counts))


if __name__ == "__main__":
    main()

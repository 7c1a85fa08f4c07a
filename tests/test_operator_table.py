"""The operator table is complete in both evaluators, and the generated Numba file is fresh."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from _cli import run_main

from bnn.nn.measure import TORCH_FUNCTIONS
from bnn.nn.measure import binary as torch_binary
from bnn.nn.measure import unary as torch_unary
from refimpl import BINARY, UNARY, Genome, measure
from refimpl.formula import parse
from refimpl.operators import FUNCTIONS


def test_table_shape_matches_spec():
    assert len(UNARY) == 18 and len(BINARY) == 14
    assert [op.code for op in UNARY] == list(range(18))
    assert [op.code for op in BINARY] == list(range(14))
    assert {op.code: op.alpha_init for op in UNARY if op.uses_alpha} == {15: 1.0, 16: 1.0, 17: 0.0}
    assert len({op.name for op in UNARY}) == 18 and len({op.name for op in BINARY}) == 14


def test_every_formula_uses_only_bound_names():
    for op in UNARY + BINARY:
        parse(op.formula)  # raises on a name the backends do not bind
    assert set(TORCH_FUNCTIONS) == set(FUNCTIONS)


# Counts 2 and 5 avoid every singularity of the table (log 0, 0/0, tan poles).
@pytest.mark.parametrize("op", UNARY, ids=lambda op: op.name)
def test_every_unary_code_evaluates_in_both_paths(op):
    x = np.array([[2.0, 5.0]])
    alpha = np.full((4, 2), 0.75)
    ref = measure(Genome((op.code, 1, 1, 1, 1, 1, 1)), x, x, x, x, alpha=alpha)  # U1(a) - 0 - 0
    ours = torch_unary(op.code, torch.as_tensor(x), torch.full((1, 2), 0.75, dtype=torch.float64))
    assert ours.shape == x.shape and ours.dtype == torch.float64
    assert np.all(np.isfinite(ref))
    np.testing.assert_allclose(ours.numpy(), ref, rtol=1e-15)


@pytest.mark.parametrize("op", BINARY, ids=lambda op: op.name)
def test_every_binary_code_evaluates_in_both_paths(op):
    x, y = np.array([[2.0, 5.0]]), np.array([[5.0, 3.0]])
    zero = np.zeros_like(x)
    ref = measure(Genome((0, 0, 1, 1, op.code, 0, 1)), x, zero, zero, y)  # B1(a, d) - (0 + 0)
    ours = torch_binary(op.code, torch.as_tensor(x), torch.as_tensor(y))
    assert np.all(np.isfinite(ref))
    np.testing.assert_allclose(ours.numpy(), ref, rtol=1e-15)


def test_zero_operator_is_a_real_zero_of_the_input_shape():
    x = torch.ones(2, 3, 4, dtype=torch.float32)
    z = torch_unary(1, x)
    assert z.shape == x.shape and z.dtype == x.dtype and not z.any()
    # 0/0 downstream is NaN in both paths (docs/design.md section 2).
    assert torch.isnan(torch_binary(4, z, z)).all()


def test_generated_numba_file_is_fresh():
    from refimpl.codegen import main

    result = run_main(main, "--check")  # in this process (tests/_cli.py): freshness needs no interpreter of its own
    assert result.returncode == 0, result.stderr


def test_importing_refimpl_does_not_import_torch():
    code = "import sys, refimpl, refimpl.engine, refimpl.infer, refimpl.measure; assert 'torch' not in sys.modules, 'torch imported'"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr

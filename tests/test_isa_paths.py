"""Every kernel path this CPU can execute computes exact counts and compiles to its own instructions.

The path in use is tested in this process; every lower path the host can execute runs in a
subprocess with ``REFIMPL_ISA`` forcing it (``tests/_isa_probe.py``, started in the background at
session start: ``tests/_isa_background.py``), so an AVX-512 host also proves the AVX2 and
portable code that laptops and ARM64 machines get. A path the host cannot
execute is skipped with that reason.
"""
import functools
import json
import os
import subprocess
import sys

import _isa_background
import _isa_probe
import pytest

from refimpl import isa

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@functools.lru_cache(maxsize=None)
def _probe(path: str) -> dict:
    if path == isa.current_path():
        return _isa_probe.probe()
    r = _isa_background.scheduled_result(path)  # started at session start by tests/conftest.py
    if r is None:
        done = _isa_background.run_probe(path)
        r = {"returncode": done.returncode, "stdout": done.stdout, "stderr": done.stderr}
    assert r["returncode"] == 0, r["stderr"][-2000:]
    return json.loads(r["stdout"].strip().splitlines()[-1])


def _runnable(path: str):
    if path not in isa.executable_paths():
        pytest.skip(f"this CPU cannot execute the {path} path (it can: {', '.join(isa.executable_paths())})")
    return _probe(path)


@pytest.mark.parametrize("path", isa.PATHS)
def test_each_path_counts_exactly_like_the_naive_oracle(path):
    result = _runnable(path)
    assert result["path"] == path
    assert result["counts_failures"] == []
    assert result["engine_failures"] == []


@pytest.mark.parametrize("path", [p for p in isa.PATHS if p != isa.current_path()])
def test_each_path_gives_the_logits_of_this_one_bit_for_bit(path):
    # Hand-built models with every layer kind, a searched measure and the real-valued shortcut:
    # the stem tile, epilogues and pooling are other code on each path (vector widths, tiles).
    # This is a check of equal bits between two runs of the same model; neither side's logits
    # are trusted more than the other's (the engine's own tests compare it with torch).
    here, there = _probe(isa.current_path())["logits"], _runnable(path)["logits"]
    assert set(there) == set(here) == {"baseline", "searched", "real_shortcut"}
    for model in here:
        assert len(there[model]) == 6 * 5
        assert there[model] == here[model], model


def test_avx2_engine_tile_accumulates_byte_lookups_in_ymm():
    result = _runnable("avx2")
    asm = result["engine_tile"]
    assert result["byte_lookup"] is True
    assert asm["vpshufb_ymm"] >= 16 and asm["vpaddb_ymm"] >= 16
    assert asm["zmm"] == 0  # (scalar popcnt: the gather's window sums, px)


def test_engine_tile_with_vector_popcount_keeps_the_outer_product():
    result = _runnable("avx512-vpopcntdq")
    assert result["byte_lookup"] is False
    assert result["engine_tile"]["vpopcntq_zmm"] >= 16


def test_avx512bw_engine_tile_accumulates_byte_lookups_in_zmm():
    result = _runnable("avx512bw")
    assert result["byte_lookup"] is True
    assert result["engine_tile"]["vpshufb_zmm"] >= 32 and result["engine_tile"]["vpopcntq_zmm"] == 0


def test_portable_engine_tile_uses_no_avx_registers():
    result = _runnable("portable")
    assert result["byte_lookup"] is True
    assert result["engine_tile"]["ymm"] == 0 and result["engine_tile"]["zmm"] == 0


def test_a_forced_path_the_cpu_lacks_is_refused_and_a_bad_name_too():
    env = {**os.environ, "REFIMPL_ISA": "sse9"}
    r = subprocess.run([sys.executable, "-c", "import refimpl"], capture_output=True, text=True, env=env, cwd=ROOT)
    assert r.returncode != 0 and "sse9" in r.stderr and "avx2" in r.stderr


def test_avx512_vpopcntdq_panel_is_one_vector_popcount_per_vector():
    asm = _runnable("avx512-vpopcntdq")["panel"]
    assert asm["vpopcntq_zmm"] >= 16
    assert asm["scalar_popcnt"] == 0


def test_avx512bw_panel_is_a_512_bit_byte_lookup():
    asm = _runnable("avx512bw")["panel"]
    assert asm["vpshufb_zmm"] >= 16 and asm["vpopcntq_zmm"] == 0
    assert asm["scalar_popcnt"] == 0


def test_avx2_panel_accumulates_256_bit_byte_lookups_with_no_avx512():
    # refimpl/kernels/byte_dot.py: per (4 pixels, channel) vector two vpshufb and a vpaddb into
    # its byte accumulator; 8 pixels x 4 channels a block.
    asm = _runnable("avx2")["panel"]
    assert asm["vpshufb_ymm"] >= 16 and asm["vpaddb_ymm"] >= 16
    assert asm["zmm"] == 0 and asm["scalar_popcnt"] == 0


@pytest.mark.parametrize("kernel", ["engine_loop", "panel_loop"])
@pytest.mark.parametrize("path,vectors,pand", [("avx2", 8, "vpand"), ("avx512bw", 16, "vpandq")])
def test_byte_lookup_inner_loop_is_six_instructions_a_vector_on_nibble_split_inputs(kernel, path, vectors, pand):
    # refimpl/kernels/byte_dot.py: a step of a block is 8 (4 pixels, channel) ymm vectors on AVX2,
    # 16 (8 pixels, channel) zmm vectors on AVX-512BW; each costs 2 vpand, 2 vpshufb, 2 vpaddb on
    # the gather's nibble-split inputs and the panels' pre-shifted weights (each channel's word
    # and the same shifted: two broadcasts a channel), and nothing spills. LLVM's own ctpop.v32i8
    # is 8 a vector (a shift and two masks of its own); the AVX-512BW outer product's ctpop.v8i64
    # 9 (its lookup, a vpsadbw and a 64-bit add).
    loop = _runnable(path)[kernel]
    assert (loop.get("vpshufb"), loop.get(pand), loop.get("vpaddb")) == (2 * vectors,) * 3, loop
    assert not any(op.startswith(("vpsrl", "vpsadbw")) for op in loop), loop
    assert loop.get("vpbroadcastq") == vectors, loop
    assert loop["stack"] == 0, loop


def test_portable_panel_uses_no_avx_registers():
    asm = _runnable("portable")["panel"]
    assert asm["ymm"] == 0 and asm["zmm"] == 0


@pytest.mark.parametrize("path,register,lanes", [("avx512-vpopcntdq", "fma_zmm", 16), ("avx512bw", "fma_zmm", 16),
                                                  ("avx2", "fma_ymm", 8)])
def test_stem_tile_is_one_vector_fma_per_pixel_and_lane_group(path, register, lanes):
    result = _runnable(path)
    pixels, channels = result["stem_tile"]
    assert result["stem"][register] >= pixels * channels // lanes
    assert result["stem"]["fma_scalar"] == 0


def test_portable_stem_tile_uses_no_avx_registers():
    stem = _runnable("portable")["stem"]
    assert stem["ymm"] == 0 and stem["zmm"] == 0

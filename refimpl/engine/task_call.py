"""Calling compiled code at its address: a serial task from the generic parallel driver of its
kind, and from a task the popcount tile and a genome's ``measure_rows``.

A genome's epilogue kernels (``refimpl/codegen/epilogue_template.py``) were Numba parallel loops,
and Numba lowers a parallel loop into three libraries (the loop body as a gufunc, its wrapper,
the caller), in each of which LLVM optimizes and emits the inlined tile and epilogue again: 3.4-4.3
s of compile per kernel and genome against 1.2 s for the same loop serial (docs/performance.md).
So the kernels became serial tasks (``<kernel>_task(first, last, ...)``: tasks ``first ..
last-1``) under parallel loops that live once, in ``refimpl/engine/_drivers.py``, compiled and
cached once for every genome; since then the tasks live there too, and a genome adds only its
``measure_rows``. A driver receives the task as the machine address of its compiled code, an
``int64``, and calls it with Numba's own calling convention (``call_task``): passing the task
as a first-class function instead cost 7-37 us a call in Python's dispatch, more than the
parallel loop itself at batch 1. A task calls the popcount tile and the genome's
``measure_rows`` the same way (``refimpl/engine/epilogue.py``'s ``tile_address`` and
``kernel``), so no genome's compile repeats the tile or the tasks.

The address is only valid for code compiled with exactly the caller's argument types:
``refimpl/engine/epilogue.py``'s ``kernel`` compiles each from one signature and disables
further compiles, so arguments of other types raise instead of reaching a mismatched call.
"""
from __future__ import annotations

import numpy as np
from numba import prange, types
from numba.extending import intrinsic

from .._jit import jit


@intrinsic
def call_task(typingctx, address, *args):
    """Call the compiled function at ``address`` (an int64, ``native_address``) with ``args``,
    in Numba's calling convention; it returns nothing and raises nothing (the tasks index only in
    bounds and use NumPy's error model)."""
    if not isinstance(address, types.Integer):
        return None
    signature = types.void(address, types.StarArgTuple.from_types(args))

    def codegen(context, builder, sig, llargs):
        arg_types = list(sig.args[1].types)
        values = [builder.extract_value(llargs[1], i) for i in range(len(arg_types))]
        function = context.call_conv.get_function_type(types.void, arg_types).as_pointer()
        context.call_conv.call_function(builder, builder.inttoptr(llargs[0], function), types.void, arg_types, values)
        return context.get_dummy_value()

    return signature, codegen


def native_address(dispatcher) -> int:
    """The address of the machine code of ``dispatcher``'s one compiled overload (not its
    Python or C wrapper): what ``call_task`` calls."""
    (result,) = dispatcher.overloads.values()
    return result.library.get_pointer_to_function(result.fndesc.llvm_func_name)


def task_address(dispatcher, signature: str) -> int:
    """``dispatcher`` (a serial task, ``first, last`` then its arguments) compiled, or loaded from
    Numba's cache, for its one ``signature``, further compiles disabled, and the address ``run_tasks``
    calls. The caller serialises calls for one dispatcher (a lock), as Numba's compile is not."""
    if not dispatcher.signatures:
        dispatcher.compile(signature)
        dispatcher.disable_compile()
    return native_address(dispatcher)


@jit(parallel=True)
def run_tasks(task, parts, n_tasks, *args):
    """Tasks ``0 .. n_tasks-1`` of the serial task at ``task`` (``task_address``), in ``parts`` equal
    runs over Numba's threads, each run one call ``task(first, last, *args)``: one parallel loop,
    compiled once per argument types for every genome, where a parallel loop per genome compiled its
    body three times (module docstring)."""
    parts = max(1, min(n_tasks, parts))
    for part in prange(parts):
        call_task(task, np.int64(n_tasks * part // parts), np.int64(n_tasks * (part + 1) // parts), *args)

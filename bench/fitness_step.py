"""The search's training step as bench/bench_fitness.py times it: generated CIFAR-shaped data on the device
and ``StepLoop``, one model and its Adam stepped as bnn.train's loop steps them (also bench/profile_step.py's).
"""
from __future__ import annotations

import math
import os
import sys
import time

import torch
import torch.nn.functional as F

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(_HERE, ".."), _HERE]  # the repository and bench/ (imported as a file too)

from bnn.data import Dataset  # noqa: E402
from bnn.nn.measure_op import use_measure_op  # noqa: E402
from bnn.nn.models import build_model  # noqa: E402
from bnn.settings import ADAM_BETAS, FITNESS  # noqa: E402
from bnn.train.graph_step import GraphStep  # noqa: E402
from bnn.train.loop import CUDA_FINITE_CHECK_EVERY  # noqa: E402

CIFAR_MEAN, CIFAR_STD = (125.3, 123.0, 113.9), (63.0, 62.1, 66.7)  # any statistics time the same


def synthetic_data(n: int, device: torch.device, seed: int = 0) -> Dataset:
    """``n`` random CIFAR-shaped uint8 images and labels, generated on ``device``; a tenth is the validation split."""
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, device=device, generator=g)
    y = torch.randint(0, 10, (n,), device=device, generator=g)
    val = n // 10
    return Dataset("cifar10", 10, [str(i) for i in range(10)], (3, 32, 32), CIFAR_MEAN, CIFAR_STD, 4, True,
                   x[val:], y[val:], x[:val], y[:val], x[:0], y[:0], val, 0, device)


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class StepLoop:
    """One model and its Adam, stepped as bnn.train's loop steps them (epoch plans, augmentation, finite check)."""

    def __init__(self, data: Dataset, genome: str, binary: bool, opts: dict, seed: int = 0, ragged: bool = False):
        device = data.device
        model = _model(genome, binary, opts, seed).to(device)
        if device.type == "cuda":
            model = model.to(memory_format=torch.channels_last)
        if binary and opts["measure_op"]:
            use_measure_op(model)
        if binary and opts["triton"]:
            from bnn.gpu.measure_op import prime_geometry, use_triton_measure

            prime_geometry(use_triton_measure(model, opts.get("relax", True)), (3, 32, 32))
        self.model, self.data, self.batch, self.binary, self.opts = model, data, opts["batch"], binary, opts
        mode = {"mode": "reduce-overhead"} if opts["cudagraphs"] else {}
        self.forward = torch.compile(model, backend=opts["compile_backend"], **mode) if opts["compile"] else model
        self.cudagraphs = opts["cudagraphs"]
        cuda, graphs = device.type == "cuda", opts["graphs"]
        fused = {"fused": True, "capturable": cuda and graphs} if (opts["fused_adam"] and cuda) or graphs else {}
        self.opt = torch.optim.Adam(model.parameters(), lr=FITNESS.lr, betas=ADAM_BETAS, **fused)
        # --graphs --compile: inductor fuses the elementwise work around the measure operator, and the
        # capture records its kernels (the genome stays data: one compiled graph for every genome).
        step_model = self.forward if graphs and opts["compile"] else model
        self.graph = GraphStep(step_model, self.opt, self.batch, (3, 32, 32), device) if graphs else None
        ragged = ragged and not graphs  # one captured shape: full batches only, as bnn.train's graphs step
        self.gen = torch.Generator().manual_seed(seed + 1)
        # ragged: bnn.train's epoch, its last batch smaller (under torch.compile a new shape, so one
        # more compile); else full batches only, so the timed steps are the steady state.
        self.per_epoch = (math.ceil if ragged else math.floor)(len(data.train_y) / self.batch)
        self.check_every = CUDA_FINITE_CHECK_EVERY if device.type == "cuda" else 1
        self.pos, self.plan = 0, None
        self.finite = torch.ones((), dtype=torch.bool, device=device)
        self.loss_sum = torch.zeros((), device=device)
        self.correct = torch.zeros((), dtype=torch.int64, device=device)

    def step(self) -> None:
        """One optimizer step on the next batch of the current epoch's plan (a new plan each epoch)."""
        i = self.pos % self.per_epoch
        if i == 0:
            self.plan = self.data.epoch_plan(self.gen)
        plan, d = self.plan, self.data
        idx = plan["perm"][i * self.batch:(i + 1) * self.batch]
        x = d.augment(d.train_x[idx], plan["offsets"][idx], plan["flips"][idx])
        y = d.train_y[idx]
        if self.graph is not None:  # the finite check is in the captured step: no wait for the device
            self.graph.run(d.normalize(x), y)
            self.pos += 1
            return
        if self.cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()  # as bnn.train's graphs step
        logits = self.forward(d.normalize(x))
        loss = F.cross_entropy(logits, y)
        self.finite = self.finite & torch.isfinite(loss)
        if (i + 1) % self.check_every == 0 or i == self.per_epoch - 1:
            self.finite.item()  # the loop's wait for the device; a diverged loss is timed like any other
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        self.loss_sum += loss.detach() * len(y)
        self.correct += (logits.detach().argmax(1) == y).sum()
        self.pos += 1

    def new_genome(self, genome: str, seed: int = 0) -> None:
        """A search worker's next candidate on this loop's kept model (--triton): the genome written in place,
        the parameters and BatchNorm statistics of a fresh seeded build copied in, Adam's state zeroed."""
        from bnn.gpu.measure_op import set_genome

        set_genome(self.model, genome, reset_alpha=False)
        self.model.load_state_dict(_model(genome, self.binary, self.opts, seed).state_dict())
        for state in self.opt.state.values():
            for value in state.values():
                value.zero_()

    def run(self, steps: int) -> float:
        """Seconds for ``steps`` steps, the device drained before and after."""
        sync(self.data.device)
        t0 = time.perf_counter()
        for _ in range(steps):
            self.step()
        sync(self.data.device)
        return time.perf_counter() - t0


def _model(genome: str, binary: bool, opts: dict, seed: int) -> torch.nn.Module:
    # A seeded network on the CPU (the same draws wherever it then goes).
    torch.manual_seed(seed)
    return build_model(opts["model"], genome, 10, (3, 32, 32), binary=binary, counts=opts["counts"])


def loop_options(args) -> dict:
    """What every StepLoop of this run shares (picklable, for the K processes)."""
    return {"batch": args.batch, "compile": args.compile, "compile_backend": args.compile_backend,
            "measure_op": args.measure_op, "fused_adam": args.fused_adam, "cudagraphs": args.cudagraphs,
            "triton": args.triton, "graphs": args.graphs, "counts": args.counts, "model": args.model}

"""The whole training step as one CUDA graph: ``--step graphs`` with ``--measure-impl triton`` (issue 37 item 3).

Captured once per model and learning rate: forward, cross-entropy, backward, Adam's fused step, and the
epoch's running sums (loss, correct predictions, steps taken) on the device. A replay reads its batch from
two static buffers, which the loop fills on the device (augmentation and normalization stay eager kernels
outside the graph), so an epoch launches no step from Python and waits for the device once, at its end.

The genome is data (bnn/gpu/measure_op.py): ``set_genome`` rewrites the codes and tables the graph reads,
so the same graph replays every candidate of a search worker (``reset_training`` puts the parameters,
BatchNorm statistics and Adam's state back in place).

Divergence without a host check: ``bad`` turns 1.0 at the first non-finite loss and stays there; it is
Adam's ``found_inf``, so the fused kernel skips that update and every later one (its step count too), and
the weights stay those the eager loop would stop with. The loop reads ``bad`` after the epoch's last replay.
BatchNorm's running statistics still see the epoch's later batches, so a diverged run's validation accuracy
may differ from the eager loop's (both report status ``diverged``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

# Steps run before the capture: cuDNN's autotuning and Triton's compilation happen there, never in capture.
WARMUP_STEPS = 3


class GraphStep:
    """One model and its fused Adam stepped by replaying one captured step (``capture``: on CUDA; on the CPU
    the same step runs eagerly, which is what the tests check)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: int,
                 input_shape: tuple[int, ...], device: torch.device, capture: bool | None = None):
        self.model, self.optimizer, self.batch = model, optimizer, batch
        self.capture = device.type == "cuda" if capture is None else capture
        self.x = torch.zeros((batch, *input_shape), device=device)
        self.y = torch.zeros((batch,), dtype=torch.int64, device=device)
        self.bad = torch.zeros((), device=device)  # 1.0 from the first non-finite loss on
        self.loss_sum = torch.zeros((), device=device)
        self.correct = torch.zeros((), dtype=torch.int64, device=device)
        self.ok_steps = torch.zeros((), dtype=torch.int64, device=device)
        optimizer.found_inf = self.bad  # read by Adam.step(): fused Adam skips the update where it is 1
        self.graph = None
        self.captured_lr: float | None = None

    def reset(self) -> None:
        """Zero the epoch's sums and the divergence flag (device kernels, no wait)."""
        for t in (self.bad, self.loss_sum, self.correct, self.ok_steps):
            t.zero_()

    def _step(self) -> None:
        # The captured step. No value is read on the host and no tensor made from host data: a CUDA graph
        # records kernels only (tests/test_graph_step.py checks the ops on the CPU).
        self.optimizer.zero_grad(set_to_none=True)  # inside the capture: backward allocates from its pool
        logits = self.model(self.x)
        loss = F.cross_entropy(logits, self.y)
        ok = torch.isfinite(loss) & (self.bad == 0)
        self.bad.copy_((~ok).to(self.bad.dtype))
        loss.backward()
        self.optimizer.step()
        zero = torch.zeros_like(loss)
        self.loss_sum.add_(torch.where(ok, loss.detach(), zero), alpha=self.batch)
        self.correct.add_(torch.where(ok, (logits.detach().argmax(1) == self.y).sum(), 0))
        self.ok_steps.add_(ok.to(self.ok_steps.dtype))

    def _prepare(self) -> None:
        # Warm up (autotuning, compilation, Adam's state), then capture. The warm-up runs with bad = 1, so Adam
        # updates nothing; the BatchNorm statistics its forwards move are put back.
        buffers = [b for b in self.model.buffers() if b.dtype.is_floating_point or b.dtype == torch.int64]
        saved = [b.clone() for b in buffers]
        self.bad.fill_(1.0)
        if self.capture:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(WARMUP_STEPS):
                    self._step()
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self._step()
        else:
            self._step()
            self.graph = "eager"
        for b, s in zip(buffers, saved):
            b.copy_(s)
        self.reset()
        self.captured_lr = self._lr()

    def _lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def run(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """One training step on the batch (x normalized, y labels): copied into the static buffers, replayed."""
        if self.graph is None or self._lr() != self.captured_lr:
            self._prepare()  # a float lr is a constant of the captured Adam kernel: a new one captures again
        self.x.copy_(x)
        self.y.copy_(y)
        if self.capture:
            self.graph.replay()
        else:
            self._step()

    def epoch_sums(self) -> dict:
        """The epoch's sums after its last step (one wait for the device): loss_sum, correct, seen, diverged."""
        return {"loss_sum": self.loss_sum, "correct": self.correct, "seen": int(self.ok_steps.item()) * self.batch,
                "diverged": bool(self.bad.item())}


def graph_epoch(step: GraphStep, data, gen: torch.Generator, steps: int, bar=None) -> dict:
    """One epoch of ``steps`` replays on batches of ``data``'s epoch plan drawn from ``gen`` (as bnn.train's
    eager loop draws them); the dict ``_train_steps`` returns, less its timing."""
    step.model.train()
    step.reset()
    plan = data.epoch_plan(gen)
    for i in range(steps):
        idx = plan["perm"][i * step.batch:(i + 1) * step.batch]
        x = data.augment(data.train_x[idx], plan["offsets"][idx], plan["flips"][idx])
        step.run(data.normalize(x), data.train_y[idx])
        if bar is not None:
            bar.update(1)
    return step.epoch_sums()

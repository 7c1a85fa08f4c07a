"""The one owner of the training and fitness settings: the paper's fitness, the presets, defaults.

``bnn.train``, ``bnn.search`` (its ``SearchConfig`` defaults, its ``paper`` preset, its workers'
trainings and its ``--help``) and ``bench/bench_train.py`` read these values instead of writing
numbers of their own. Pure Python: importing it loads neither torch nor a data set.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping, TypeVar


@dataclass(frozen=True)
class FitnessSettings:
    """The paper's fitness of a candidate measure (docs/design.md section 7): ResNet-18 on CIFAR-10,
    Adam at a constant lr for ``epochs`` epochs, rejected after epoch 1 below the threshold in force,
    the thresholds taking over at the given evaluation indices."""

    epochs: int = 15
    batch_size: int = 128
    lr: float = 5e-3
    milestones: tuple[int, ...] = ()  # constant lr: no step during a fitness training
    gamma: float = 0.2  # lr factor at a milestone: none here, but the presets below share it
    thresholds: tuple[float, ...] = (0.11, 0.25, 0.35, 0.40)
    threshold_steps: tuple[int, ...] = (0, 100, 200, 300)  # evaluation index at which each T takes over

    def schedule(self, **changes: Any) -> dict:
        """The training schedule (the TrainConfig keys epochs, batch_size, lr, milestones, gamma), with ``changes``."""
        keys = ("epochs", "batch_size", "lr", "milestones", "gamma")
        unknown = sorted(set(changes) - set(keys))
        if unknown:
            raise ValueError(f"unknown schedule key(s) {', '.join(unknown)}; valid: {', '.join(keys)}")
        return {**{k: getattr(self, k) for k in keys}, **changes}


FITNESS = FitnessSettings()
# The paper's population size S.
PAPER_POPULATION = 30

# Every preset is the paper's batch size, lr and gamma with its own epochs and milestones
# (epochs after which lr *= gamma). Adam betas (0.9, 0.999) and no weight decay everywhere.
PRESETS = {
    # The paper's evaluation tables: 300 epochs, lr divided by 5 at the milestones.
    "paper-eval": FITNESS.schedule(epochs=300, milestones=(80, 150, 200, 240, 270)),
    # The paper's fitness: ResNet-18 on CIFAR-10 at a constant lr.
    "fitness": FITNESS.schedule(),
    # The embedded default: 1,293 training images, 11 steps an epoch. The last quarter at a fifth
    # of the lr settles BatchNorm statistics and the weights' signs (baseline, seed 0: 97.5% test at 30
    # epochs, 96.7% at 40 with the step at 30).
    "digits": FITNESS.schedule(epochs=30, milestones=(22,)),
    # MNIST and Fashion-MNIST with mnist_net, sized for 10 minutes on 2 CPU cores: 4 epochs at
    # 5e-3, one at 1e-3, one at 2e-4 (Fashion-MNIST, baseline, seed 0: val 84.1% after epoch 4,
    # 87.8% after 6, test 87.0%; the two steps are worth 3.7 points).
    "mnist": FITNESS.schedule(epochs=6, milestones=(4, 5)),
}
DEFAULT_PRESET = {"digits": "digits", "mnist": "mnist", "fashion-mnist": "mnist", "cifar10": "fitness",
                  "cifar100": "fitness"}
# The architectures bnn.nn.models.MODELS builds, named here for the commands' help without torch.
MODEL_NAMES = ("resnet18", "resnet34", "vgg13", "nin", "digits_net", "mnist_net")
DEFAULT_MODEL = {"digits": "digits_net", "mnist": "mnist_net", "fashion-mnist": "mnist_net",
                 "cifar10": "resnet18", "cifar100": "resnet18"}
ADAM_BETAS = (0.9, 0.999)

# How a training step runs (bnn/train/loop.py):
#   eager     the layers as written, Adam's for-each kernel, every batch (the last one ragged);
#   compiled  torch.compile with the measure as one opaque operator (bnn/nn/measure_op.py: a new
#             genome reuses the compiled graph), full batches only (one shape: no second compile),
#             Adam's fused kernel on CUDA;
#   graphs    the same, but torch.compile's mode="reduce-overhead" (CUDA graphs) with the genome in
#             the graph (an operator with a CPU argument is never captured): a new genome recompiles;
#             with measure_impl "triton", the whole step (forward, loss, backward, Adam) captured once as
#             one CUDA graph (bnn/train/graph_step.py) that replays every genome;
#   auto      graphs on CUDA with measure_impl "triton" (12,111 images/s against compiled's 3,638 on an
#             H200), else compiled on CUDA; eager on the CPU (inductor's C++ compile takes minutes there).
STEPS = ("auto", "eager", "compiled", "graphs")
# How a binary layer's measure runs in training (bnn/nn/layers.py set_measure_impl):
#   fused  bnn/nn/measure_fused.py: one Numba pass forward and one backward, where it applies (float32
#          counts on the CPU, outside torch.compile), eager elsewhere; TrainConfig's default;
#   eager  torch operators, one pass over memory each, forward and backward;
#   triton bnn/gpu's Triton kernels, the genome as data (one compiled graph and one CUDA graph for every
#          genome): CUDA only (or Triton's interpreter on a CPU, for tests).
# They agree to float32 rounding, not to the bit. A checkpoint, evidence protocol or search
# journal written before the setting existed trained eager: MEASURE_IMPL_BEFORE, not the default.
MEASURE_IMPLS = ("fused", "eager", "triton")
MEASURE_IMPL_BEFORE = "eager"

T = TypeVar("T")


def from_mapping(cls: type[T], mapping: Mapping[str, Any]) -> T:
    """``cls(**mapping)`` for a dataclass, refusing keys it has no field for (a typo is an error, never dropped)."""
    valid = [f.name for f in fields(cls)]
    unknown = sorted(set(mapping) - set(valid), key=str)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} setting(s) {', '.join(map(repr, unknown))}; "
                         f"valid: {', '.join(valid)}")
    return cls(**mapping)


"""The evidence grid's protocol per data set: the only place its defaults are set (every option of
``python -m bnn.evidence`` can override them), and how ``--help`` shows them."""
from __future__ import annotations

from ..settings import FITNESS

PROTOCOLS = {
    # Sized so the 42 default cells fit well under 2 hours on 2 CPU cores (mnist_net costs about
    # 3.3 ms of CPU per training image): 24,000 training images and 15,000 evaluated per cell.
    "fashion-mnist": dict(
        epochs=3,  # passes over the training subset; the last at lr * 0.2
        train_size=8000,  # training images (a seeded subset of the 55,000 left after validation)
        batch_size=FITNESS.batch_size,  # images per step: the paper's
        lr=FITNESS.lr,  # Adam learning rate: the paper's
        milestones=(2,),  # epochs after which lr *= gamma (0.2): the step settles the signs
    ),
    # The embedded 8x8 set: the smoke test's data (1,293 training images).
    "digits": dict(epochs=30, train_size=None, batch_size=FITNESS.batch_size, lr=FITNESS.lr, milestones=(22,)),
}
PROTOCOLS["mnist"] = dict(PROTOCOLS["fashion-mnist"])
# CIFAR: the paper's fitness recipe (ResNet-18, 15 epochs at a constant lr), GPU work (one cell about 51 s
# on an H200 with --measure-impl triton, docs/performance.md); the paper's own evaluation is 300 epochs
# (--epochs 300 --milestones 80,150,200,240,270, bnn.train's paper-eval preset).
PROTOCOLS["cifar10"] = dict(epochs=FITNESS.epochs, train_size=None, batch_size=FITNESS.batch_size, lr=FITNESS.lr,
                            milestones=FITNESS.milestones)
PROTOCOLS["cifar100"] = dict(PROTOCOLS["cifar10"])
SEEDS = (0, 1, 2)
REAL_MEASURES = ("baseline", "M5", "M9")  # also trained with downsample=real
# --smoke: a whole grid in seconds (4 cells of 3 steps), for tests and a first look.
SMOKE = dict(dataset="digits", measures="baseline,M1", seeds="0,1", real_measures="none", epochs=1,
             batch_size=512, milestones="")


def protocol_text(key: str) -> str:
    """A protocol setting per data set for --help, e.g. "fashion-mnist 3, digits 30"."""
    def shown(v):
        return "all" if v is None else (",".join(map(str, v)) or "none") if isinstance(v, tuple) else f"{v:g}"
    return ", ".join(f"{name} {shown(p[key])}" for name, p in PROTOCOLS.items())

"""BNN model families (docs/design.md section 6), one genome for every binary layer, built by name.

Every model has the same flat shape, so an exporter walks it without special cases:

    x -> stem (nn.Conv2d, full precision) -> stem_bn (nn.BatchNorm2d)
      -> body: nn.Sequential of BinaryUnit, nn.MaxPool2d and nn.AvgPool2d, in execution order
      -> global average pool -> flatten -> classifier (nn.Linear, full precision)

A ``BinaryUnit`` computes

    y = bn(conv(x))                                   residual=False (VGG, NIN)
    y = bn(conv(x)) + x                               residual, same shape (Bi-Real shortcut)
    y = bn(conv(x)) + down_bn(down_conv(x))           residual, stride or width changes

where ``conv`` is a ``BinaryConv2d`` (it binarizes its own input with sign), so every binary
layer is followed directly by its BatchNorm and nothing else sits between them. The downsampling
shortcut (docs/design.md section 6, ``downsample=``) is either binary (default, the paper's text: ``down_conv`` is
a 1x1 ``BinaryConv2d`` with the unit's stride) or real (Bi-Real practice: ``down_pool``, a
stride x stride average pool with ``ceil_mode`` so odd maps give the conv's ceil(H/stride), then
``down_conv``, a full-precision 1x1 ``nn.Conv2d`` with stride 1).
There is no other nonlinearity: the sign inside each binary layer is the network's activation
(as in Bi-Real-Net); a ReLU before a sign would make every activation +1.

NIN's last layer is a 1x1 convolution followed by global average pooling; both are linear, so
it is the same function as pooling first and then ``nn.Linear``, which is what is built here.

``model.config`` holds what export needs to rebuild the model (``build_model(**config)``):
arch, measure, num_classes, input_shape, downsample, counts (the count convention of every binary layer,
refimpl/conventions.py; configs written before it existed rebuild as ``raw``).
"""
from __future__ import annotations

import numpy as np
from torch import nn

from refimpl.conventions import DEFAULT as DEFAULT_COUNTS
from refimpl.conventions import check_counts
from refimpl.engine.format import DOWNSAMPLE_KINDS  # the model file's kinds: one list for both paths
from refimpl.genome import Genome

from .layers import BinaryConv2d

# (channels, blocks, first stride) per stage, CIFAR ResNets (He et al. 2016, with a 3x3 stem).
_RESNET_STAGES = {
    "resnet18": ((64, 2, 1), (128, 2, 2), (256, 2, 2), (512, 2, 2)),
    "resnet34": ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)),
}
DIGITS_WIDTH = 64  # channels of digits_net: wide enough for >=95% with any paper measure
# VGG13 for CIFAR: 'M' = 2x2 max-pool; five pools take 32x32 to 1x1 (28x28: 14, 7, 4, 2, 1).
_VGG13 = (64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")
# mnist_net for 1x28x28: a stride-2 full-precision stem to 14x14, then (width, units) per stage,
# each stage after the first opening with a stride-2 unit: 32 at 14x14, 64 at 7x7, 128 at 4x4.
# Units on the small maps are cheap: three per stage instead of two cost ~20% more time and
# gave +0.9 points on Fashion-MNIST, +0.25 on MNIST (6 epochs, seed 0).
MNIST_STEM = (32, 2)  # stem channels, stem stride
_MNIST_STAGES = ((32, 1), (64, 3), (128, 3))


def check_downsample(kind) -> str:
    """``kind`` if it is a downsampling kind (docs/design.md section 6), else ValueError naming the valid set."""
    if kind not in DOWNSAMPLE_KINDS:
        raise ValueError(f"unknown downsample {kind!r}; choose one of {', '.join(DOWNSAMPLE_KINDS)}")
    return kind


class BinaryUnit(nn.Module):
    """One binary convolution, its BatchNorm, and (optionally) a real-valued shortcut."""

    def __init__(self, in_ch, out_ch, kernel_size, stride=1, padding=0, measure="baseline",
                 residual=False, binary=True, downsample="binary", counts=DEFAULT_COUNTS):
        super().__init__()
        self.downsample = check_downsample(downsample)
        conv = _conv_factory(binary, measure, counts)
        self.conv = conv(in_ch, out_ch, kernel_size, stride, padding)
        self.bn = nn.BatchNorm2d(out_ch)
        self.residual = residual
        self.down_pool = self.down_conv = self.down_bn = None
        if residual and (stride != 1 or in_ch != out_ch):
            if downsample == "binary":
                # docs/design.md section 6: the paper's text makes the downsampling 1x1 convolution binary too.
                self.down_conv = conv(in_ch, out_ch, 1, stride, 0)
            else:
                if stride != 1:
                    self.down_pool = nn.AvgPool2d(stride, stride, ceil_mode=True)
                self.down_conv = nn.Conv2d(in_ch, out_ch, 1, bias=False)
            self.down_bn = nn.BatchNorm2d(out_ch)

    def forward(self, x):
        """BatchNorm of the convolution of ``x``, plus the shortcut (identity or downsampled) when residual."""
        y = self.bn(self.conv(x))
        if not self.residual:
            return y
        if self.down_conv is None:
            return y + x
        if self.down_pool is not None:
            x = self.down_pool(x)
        return y + self.down_bn(self.down_conv(x))


def _conv_factory(binary: bool, measure, counts):
    if binary:
        return lambda i, o, k, s, p: BinaryConv2d(i, o, k, stride=s, padding=p, measure=measure, counts=counts)
    # Same shapes in float: the "ordinary network" that bench/bench_train.py compares against.
    return lambda i, o, k, s, p: nn.Conv2d(i, o, k, stride=s, padding=p, bias=False)


class BNNet(nn.Module):
    """stem -> stem_bn -> body -> global average pool -> classifier (see the module docstring)."""

    def __init__(self, arch, measure, num_classes, input_shape, stem_out, stem_kernel, body, body_out,
                 downsample="binary", stem_stride=1, counts=DEFAULT_COUNTS):
        super().__init__()
        in_ch = input_shape[0]
        self.stem = nn.Conv2d(in_ch, stem_out, stem_kernel, stride=stem_stride, padding=stem_kernel // 2, bias=False)
        self.stem_bn = nn.BatchNorm2d(stem_out)
        self.body = nn.Sequential(*body)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(body_out, num_classes)
        self.config = {
            "arch": arch,
            "measure": str(Genome.parse(measure)),
            "num_classes": int(num_classes),
            "input_shape": [int(v) for v in input_shape],
            "downsample": check_downsample(downsample),
            "counts": check_counts(counts),
        }

    def forward(self, x):
        """Logits (N, classes) of images ``x`` (N, C, H, W)."""
        x = self.stem_bn(self.stem(x))
        x = self.body(x)
        return self.classifier(self.pool(x).flatten(1))


def resnet(arch, measure="baseline", num_classes=10, input_shape=(3, 32, 32), binary=True, downsample="binary",
           counts=DEFAULT_COUNTS):
    """A Bi-Real ResNet (``resnet18`` or ``resnet34``): every basic block's 3x3 convolutions binary, each with
    its own shortcut."""
    body, ch = [], 64
    for width, blocks, stride in _RESNET_STAGES[arch]:
        for i in range(blocks):
            s = stride if i == 0 else 1
            # A basic block's two 3x3 convolutions, each with its own shortcut (Bi-Real).
            body.append(BinaryUnit(ch, width, 3, s, 1, measure, residual=True, binary=binary, downsample=downsample,
                                   counts=counts))
            body.append(BinaryUnit(width, width, 3, 1, 1, measure, residual=True, binary=binary, counts=counts))
            ch = width
    return BNNet(arch, measure, num_classes, input_shape, 64, 3, body, ch, downsample, counts=counts)


def resnet18(measure="baseline", num_classes=10, input_shape=(3, 32, 32), binary=True, downsample="binary",
        counts=DEFAULT_COUNTS):
    """ResNet-18: ``resnet("resnet18", ...)``."""
    return resnet("resnet18", measure, num_classes, input_shape, binary, downsample, counts)


def resnet34(measure="baseline", num_classes=10, input_shape=(3, 32, 32), binary=True, downsample="binary",
        counts=DEFAULT_COUNTS):
    """ResNet-34: ``resnet("resnet34", ...)``."""
    return resnet("resnet34", measure, num_classes, input_shape, binary, downsample, counts)


def vgg13(measure="baseline", num_classes=10, input_shape=(3, 32, 32), binary=True, downsample="binary",
        counts=DEFAULT_COUNTS):
    """VGG13 with a full-precision first convolution and binary others; odd sides pool with one padded row."""
    widths = list(_VGG13)
    body, ch = [], widths.pop(0)  # the first 64-channel convolution is the full-precision stem
    size = list(input_shape[1:])
    for v in widths:
        if v == "M":
            # An odd side pads one (-inf) row/column, so its last row is pooled, not dropped:
            # 28x28 ends at 1x1 like 32x32 (the engine has no ceil_mode; padding is exact).
            pad = tuple(n % 2 for n in size)
            body.append(nn.MaxPool2d(2, padding=pad if any(pad) else 0))
            size = [(n + 1) // 2 for n in size]
        else:
            body.append(BinaryUnit(ch, v, 3, 1, 1, measure, binary=binary, counts=counts))
            ch = v
    # No shortcuts, so nothing to downsample; the kind is still recorded, as for every model.
    return BNNet("vgg13", measure, num_classes, input_shape, 64, 3, body, ch, downsample, counts=counts)


def nin(measure="baseline", num_classes=10, input_shape=(3, 32, 32), binary=True, downsample="binary",
        counts=DEFAULT_COUNTS):
    """Network in Network for CIFAR (Lin et al. 2014; XNOR-Net's binary version's widths)."""
    # Fully convolutional with global pooling: 28x28 runs as 28 -> 14 -> 7, 32x32 as 32 -> 16 -> 8.
    def unit(i, o, k):
        return BinaryUnit(i, o, k, 1, k // 2, measure, binary=binary, counts=counts)

    body = [
        unit(192, 160, 1), unit(160, 96, 1),
        nn.MaxPool2d(3, stride=2, padding=1),
        unit(96, 192, 5), unit(192, 192, 1), unit(192, 192, 1),
        nn.AvgPool2d(3, stride=2, padding=1),
        unit(192, 192, 3), unit(192, 192, 1),
    ]
    return BNNet("nin", measure, num_classes, input_shape, 192, 5, body, 192, downsample, counts=counts)


def digits_net(measure="baseline", num_classes=10, input_shape=(1, 8, 8), binary=True, downsample="binary",
        counts=DEFAULT_COUNTS):
    """For the 8x8 digits: full-precision 3x3 stem, three binary 3x3 units with shortcuts.

    Every unit keeps width and size, so ``downsample`` changes no layer; it is recorded.
    """
    w = DIGITS_WIDTH
    body = [BinaryUnit(w, w, 3, 1, 1, measure, residual=True, binary=binary, counts=counts) for _ in range(3)]
    return BNNet("digits_net", measure, num_classes, input_shape, w, 3, body, w, downsample, counts=counts)


def mnist_net(measure="baseline", num_classes=10, input_shape=(1, 28, 28), binary=True, downsample="binary",
        counts=DEFAULT_COUNTS):
    """Small and fast for 1x28x28 (MNIST, Fashion-MNIST) on a CPU: a stride-2 3x3 full-precision
    stem, then seven binary 3x3 units with Bi-Real shortcuts, 32 -> 64 -> 128 channels on 14 -> 7
    -> 4 maps (1, 3, 3 units); a stage's first unit has stride 2 and its shortcut is the
    downsampling path."""
    stem, stem_stride = MNIST_STEM
    body, ch = [], stem
    for i, (width, units) in enumerate(_MNIST_STAGES):
        for j in range(units):
            s = 2 if i > 0 and j == 0 else 1
            body.append(BinaryUnit(ch, width, 3, s, 1, measure, residual=True, binary=binary, downsample=downsample,
                                   counts=counts))
            ch = width
    return BNNet("mnist_net", measure, num_classes, input_shape, stem, 3, body, ch, downsample, stem_stride, counts)


MODELS = {
    "resnet18": resnet18,
    "resnet34": resnet34,
    "vgg13": vgg13,
    "nin": nin,
    "digits_net": digits_net,
    "mnist_net": mnist_net,
}


def build_model(arch, measure="baseline", num_classes=10, input_shape=(3, 32, 32), binary=True,
                downsample="binary", counts=DEFAULT_COUNTS) -> BNNet:
    """A model from the registry (``build_model(**model.config)`` rebuilds one); unknown names,
    measures, downsampling kinds and count conventions raise ValueError."""
    if arch not in MODELS:
        raise ValueError(f"unknown model {arch!r}; choose one of {', '.join(MODELS)}")
    genome = Genome.parse(measure)  # ValueError naming the problem
    check_downsample(downsample)
    check_counts(counts)
    # From a checkpoint's model_config: whole numbers only (28.5 or "28" is refused, not truncated).
    ints = (int, np.integer)
    if not (isinstance(num_classes, ints) and not isinstance(num_classes, bool) and num_classes >= 1):
        raise ValueError(f"num_classes must be a positive integer, got {num_classes!r}")
    shape = tuple(input_shape)
    if not (len(shape) == 3 and all(isinstance(v, ints) and not isinstance(v, bool) and v >= 1 for v in shape)):
        raise ValueError(f"input_shape must be 3 positive integers (C, H, W), got {input_shape!r}")
    return MODELS[arch](measure=str(genome), num_classes=num_classes, input_shape=tuple(input_shape), binary=binary,
                        downsample=downsample, counts=counts)


def binary_layers(model: nn.Module) -> list[BinaryConv2d]:
    """Every ``BinaryConv2d`` of ``model``, in module order."""
    return [m for m in model.modules() if isinstance(m, BinaryConv2d)]


def calibrate_batchnorm(model: nn.Module, x, passes: int = 2) -> nn.Module:
    """Set every BatchNorm's running statistics from the batch ``x`` and return the model in eval.

    A cumulative average (``momentum=None``) over ``passes`` forward passes in train mode: a freshly
    initialized (or re-binarized) network then has activations of sensible scale, which is what
    export and the parity checks need without training.
    """
    import torch

    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.reset_running_stats()
            m.momentum = None
    model.train()
    with torch.no_grad():
        for _ in range(passes):
            model(x)
    return model.eval()

"""Small networks for the parity checks that the registered models do not cover."""
from __future__ import annotations

from bnn.nn.models import BinaryUnit, BNNet
from refimpl.genome import Genome

# (in, out, stride) per unit: stride 2 with a width change, width alone, stride 2 alone.
_DOWNSAMPLING_UNITS = ((32, 32, 1), (32, 64, 2), (64, 64, 1), (64, 96, 1), (96, 96, 2), (96, 128, 2))


def downsampling_net(measure="baseline", num_classes=10, input_shape=(1, 8, 8), binary=True, downsample="binary",
                     counts="raw"):
    """A digits-sized BNN whose units downsample in every way a shortcut can (docs/design.md section 6): 8x8 maps
    go 8, 4, 2, 1; odd maps (14x14: 14, 7, 4, 2) make the stride-2 shortcuts round up.
    Same signature as ``bnn.nn.models``' builders, so it can stand in the registry in tests."""
    measure = str(Genome.parse(measure))
    body = [BinaryUnit(i, o, 3, s, 1, measure, residual=True, binary=binary, downsample=downsample, counts=counts)
            for i, o, s in _DOWNSAMPLING_UNITS]
    return BNNet("downsampling_net", measure, num_classes, input_shape, 32, 3, body, _DOWNSAMPLING_UNITS[-1][1],
                 downsample, counts=counts)

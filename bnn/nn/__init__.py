"""The differentiable path (docs/design.md sections 1, 2 and 6): ``counts`` (the contingency
counts of dense and convolution layers, as torch operations), ``measure`` (the measure graph in
eager torch), ``layers`` (sign, the straight-through estimators, BinaryConv2d and BinaryLinear),
``measure_op`` (the measure as one opaque operator for torch.compile), ``measure_fused`` (its
forward and backward as one Numba pass each) and ``models`` (the networks)."""

"""The paper's evaluation tables, transcribed from its LaTeX (seeds/000_eb250697b49d937a.txt):
Table "Evaluation of Similarity Measures on Cifar10" (label M_cifar10, top-1) and Table
"Evaluation of Similarity Measures on Cifar100" (label M_cifar100, top-1/top-5).

Values are PERCENT exactly as printed (the rest of the project uses fractions). The paper calls
them "top-1 validation accuracy" after 300 epochs; ``bnn.reproduce`` sets our test accuracy beside
them. Its "(a+d)-(b+c)" row is the baseline.
"""
MEASURES = ("baseline", "M1", "M2", "M3", "M4", "M5", "M6", "M7", "M8", "M9", "M10")
CIFAR10_MODELS = ("resnet18", "resnet34", "nin", "vgg13")
CIFAR100_MODELS = ("resnet34", "nin", "vgg13")

# measure -> (ResNet-18, ResNet-34, NIN-Net, VGG13), top-1 %
_CIFAR10_ROWS = {
    "baseline": (90.51, 91.00, 86.46, 88.83),
    "M1": (91.00, 91.59, 86.63, 88.70),
    "M2": (90.98, 91.56, 86.54, 89.20),
    "M3": (90.83, 91.50, 86.60, 89.32),
    "M4": (91.11, 91.65, 86.44, 89.17),
    "M5": (90.84, 90.88, 86.26, 88.62),
    "M6": (91.14, 91.37, 86.48, 89.09),
    "M7": (91.07, 91.31, 86.83, 88.96),
    "M8": (91.00, 91.75, 86.19, 89.34),
    "M9": (90.81, 91.66, 86.79, 89.38),
    "M10": (90.87, 91.62, 86.51, 89.24),
}

# measure -> ((top-1, top-5) for ResNet-34, NIN-Net, VGG13), %
_CIFAR100_ROWS = {
    "baseline": ((62.04, 86.08), (56.63, 83.77), (55.56, 81.06)),
    "M1": ((63.85, 87.25), (57.77, 85.16), (58.42, 83.39)),
    "M2": ((63.22, 86.73), (56.61, 84.07), (58.04, 84.07)),
    "M3": ((62.78, 86.58), (56.78, 84.18), (57.63, 83.07)),
    "M4": ((63.65, 86.99), (57.48, 84.90), (58.26, 83.58)),
    "M5": ((61.49, 85.26), (57.33, 84.17), (58.95, 84.44)),
    "M6": ((63.06, 86.87), (56.72, 84.61), (57.56, 82.63)),
    "M7": ((63.64, 87.05), (57.84, 85.20), (58.06, 83.90)),
    "M8": ((63.42, 87.19), (57.15, 84.56), (57.97, 83.46)),
    "M9": ((64.96, 88.07), (56.29, 83.44), (57.59, 83.22)),
    "M10": ((64.56, 87.66), (57.09, 84.71), (57.14, 82.39)),
}

# (dataset, model, measure) -> {"top1": %, "top5": % or None}
PAPER: dict[tuple[str, str, str], dict[str, float | None]] = {}
for _m, _row in _CIFAR10_ROWS.items():
    for _model, _top1 in zip(CIFAR10_MODELS, _row):
        PAPER[("cifar10", _model, _m)] = {"top1": _top1, "top5": None}
for _m, _row in _CIFAR100_ROWS.items():
    for _model, (_top1, _top5) in zip(CIFAR100_MODELS, _row):
        PAPER[("cifar100", _model, _m)] = {"top1": _top1, "top5": _top5}

# The evaluation grid, in the tables' order: 44 CIFAR-10 cells and 33 CIFAR-100 cells.
GRID: tuple[tuple[str, str, str], ...] = tuple(
    [("cifar10", model, m) for model in CIFAR10_MODELS for m in MEASURES]
    + [("cifar100", model, m) for model in CIFAR100_MODELS for m in MEASURES]
)

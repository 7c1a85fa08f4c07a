"""Data set names: one spelling for every command line, and each set's image shape."""
from __future__ import annotations

DATASETS = ("digits", "mnist", "fashion-mnist", "cifar10", "cifar100")
INPUT_SHAPES = {"digits": (1, 8, 8), "mnist": (1, 28, 28), "fashion-mnist": (1, 28, 28),
                "cifar10": (3, 32, 32), "cifar100": (3, 32, 32)}


def canonical_name(name: str) -> str:
    """The registered spelling of a data set name: case, '-' and '_' do not matter."""
    key = str(name).lower().replace("-", "").replace("_", "")
    for known in DATASETS:
        if known.replace("-", "") == key:
            return known
    raise ValueError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")


def dataset_arg(text: str) -> str:
    """``argparse`` type of every ``--dataset`` option: the canonical name, or the choices."""
    import argparse

    try:
        return canonical_name(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None

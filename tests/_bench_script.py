"""A script of bench/ loaded as a fresh module for a test (bench/ is not a package)."""
import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"


def load(name: str):
    """``bench/<name>.py`` as a new module, so that a test may patch its names freely."""
    spec = importlib.util.spec_from_file_location(f"{name}_under_test", BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

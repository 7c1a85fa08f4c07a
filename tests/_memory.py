"""The peak of Python-level allocations while a function runs (tracemalloc: NumPy's buffers included)."""
import tracemalloc


def peak_bytes_while(fn) -> int:
    """Bytes at the peak of traced allocations during ``fn()``; tracing stops even if it raises."""
    tracemalloc.start()
    try:
        fn()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak

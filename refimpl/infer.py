"""``python -m refimpl.infer``: the engine's command line, kept at its documented name
(refimpl/engine/infer.py holds it)."""
from .engine.infer import main

if __name__ == "__main__":
    raise SystemExit(main())

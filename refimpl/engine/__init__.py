"""CPU inference of exported models, with NumPy and Numba only (it never imports torch).

    model = refimpl.engine.load("MODEL.bnn")
    logits = model.run(model.preprocess(images))        # or model.predict(images)

* ``format``: the ``.bnn`` format, its name, version and typed layer records (``bnn/export/model_file.py``
  writes them);
* ``model_file`` (with ``_safetensors``): reads a file and checks every field, the one place
  that validates one (``ModelFileError``, one line, for anything the kernels could not run);
* ``model`` (``Model``, ``load``), ``plan`` (one step per layer and its buffers), ``budget``
  (a plan's bytes counted from its geometry and refused above a limit before any allocation),
  ``float_kernels`` (stem, shortcut, pooling, classifier) and ``epilogue`` (the per-genome fused
  epilogue, generated from ``refimpl/codegen/epilogue_template.py`` and cached);
* ``infer``: ``python -m refimpl.infer``; ``summary``: each layer's output and costs (its
  ``--summary``, and ``Model.summary()``).
"""
from .format import FORMAT, SUPPORTED_VERSIONS, VERSION
from .model import Model, load
from .model_file import ModelFileError, describe, read

__all__ = ["FORMAT", "SUPPORTED_VERSIONS", "VERSION", "Model", "ModelFileError", "describe", "load", "read"]

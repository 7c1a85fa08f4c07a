"""The GPU measure path (issue 37): Triton kernels that read the genome as data, one custom operator for
every genome, and ``set_genome`` that rewrites a model's genome buffers in place.

Needs the ``triton`` package (``pip install .[gpu]``); on a CPU the kernels run only under Triton's
interpreter (``TRITON_INTERPRET=1``, set before ``triton`` is imported), which the tests use.
"""

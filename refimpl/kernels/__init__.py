"""The count kernels: bit-packed popcount GEMMs for the contingency counts a, b, c, d.

Layers, from the bits up (each module imports only those above it):

* ``bits``: the bit conventions, packing, the ``ctpop`` and sign-word intrinsics;
  ``fma``: float32 fused multiply-add as torch's CPU BatchNorm computes it.
* ``tiling``: the tile sizes and the names of the generated tile functions, shared by the
  generators (``refimpl/codegen/``) and the runtime, so that runtime code never imports a
  generator; ``_tiles.py`` and ``_pack.py``: the generated register-blocked kernels.
* ``gemm`` (the simple reference GEMM), ``blocked`` (``ConvPlan``, the fast one).
* The counts API and its parts: ``geometry`` (argument checks, output sizes),
  ``window_sums`` (px, pw, n over in-bounds taps), ``identity_row`` (the LLVM intrinsic that
  writes a row of a, b, c, d), ``fused`` (GEMM and identities in one pass), ``outputs`` (the
  recycled output blocks) and ``counts`` (``counts_conv2d``, ``counts_dense``); ``scratch``:
  per-thread scratch rows that share no cache line.

Kernels for one instruction set (refimpl/isa.py's paths) live here too: ``byte_dot`` is the
popcount tile of the paths without a vector popcount, ``avx512bw``, ``avx2`` and ``portable``
(8 or 4 pixels a vector, byte-lane counts, ``vpshufb`` on nibble-split inputs on x86, generic
LLVM vector IR elsewhere); the generated tiles (engine and counts API) take it when their
compile-time constant ``BYTE_LOOKUP`` says so, reading the same weight panels;
``outer_product`` is the tile of the ``avx512-vpopcntdq`` path (an outer product of 64-bit
words, 8 a 512-bit vector). The other hand-written vector intrinsics: ``pack_lanes`` (the packing step of
``bits.pack_nchw``) and ``fma_tile`` (the engine stem's float32 tile). Writing them as LLVM
vectors, not as named scalars for the SLP vectorizer, is what keeps their compile to a second;
``vector_ir`` holds the IR and typing helpers they share.
"""

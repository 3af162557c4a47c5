"""The kernels' wing: one module per family of CUDA kernels, each with its torch twin, over one CuPy loader.

* :mod:`~lightning_ig.ops._cupy`: the only module that imports CuPy. Finds, compiles (once per device and
  options, with ``#line``) and caches ``kernels/*.cu``; launches on torch's current stream; says which backend
  runs (:func:`~lightning_ig.ops._cupy.choose_backend`).
* :mod:`~lightning_ig.ops.dtypes`: the dtypes the kernels take (entry-point suffixes), and the dtype sums run in.
* :mod:`~lightning_ig.ops.ig`: the five operations of ``kernels/ig.cu`` (the engine's), kernels and twins as
  :class:`~lightning_ig.ops.ig.CudaIG` and :class:`~lightning_ig.ops.ig.TorchIG`.
* :mod:`~lightning_ig.ops.soft_margin`: ``kernels/soft_margin.cu``'s launchers, the torch twin and the
  ``autograd.Function`` of the fused loss (:mod:`lightning_ig.losses` is its public face).

A new kernel family goes here as one module: its launchers, its bit-identical torch twin and its
``autograd.Function``, with the ``.cu`` file in ``kernels/``. Nothing is exported from the package itself: each
user imports the family it runs, so loading one does not load the others.
"""

__all__: list[str] = []

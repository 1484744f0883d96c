"""KFP v2 components: one thin lightweight component per ``vlp.steps`` function.

Every component runs in the project's image (``docker/image.env``; GPU steps in its ``-cuda`` variant) with
``install_kfp_package=False`` and nothing installed at run time. A body only imports and calls
``vlp.steps`` (and the small shared glue in :mod:`components._runtime`), inside the function, because KFP
ships the function's source alone. This package keeps no imports at its top so that importing
``components._runtime`` in a container never needs ``kfp`` or the compile-time image file.
"""

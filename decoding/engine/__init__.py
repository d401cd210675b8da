"""The engine every method runs on: the decoding loop (`loop`), the target-model wrapper and its
per-layer attention layout, token trees, acceptance, sampling, metrics and tie diagnosis."""

from pipeline.environment import old_libraries

_OLD = old_libraries()
if _OLD:  # before a submodule's import fails on a name an older transformers lacks
    raise ImportError(_OLD)

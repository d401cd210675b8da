"""The engine every method runs on: the decoding loop (`loop`), the target-model wrapper and its
per-layer attention layout, token trees, acceptance, sampling, metrics and tie diagnosis."""

"""Optional `torch.compile` of a method's drafting loop: the loops whose per-step cost is the dispatch of
hundreds of tiny operations, not arithmetic (the Domino chain: ~25 small ops per drafted position; EAGLE-3's
tree expansion, its drafter passes included).

Compiled on a CPU, such a loop is one C++ program from inductor (the Domino chain of the host-overhead
model runs 3-5x faster: benchmarks/bench_domino_chain.py); on a GPU (default mode) it should be a few fused
Triton kernels plus a cuBLAS call per position, still launched one by one. On CUDA the Domino chain is
replayed from a CUDA graph by default instead (`method.cuda_graph`, decoding/engine/cuda_graph.py); the two are
not combined. Shapes are static (`dynamic=False`): a loop
sees one block size and one candidate-pool width per run, so it compiles once per branch it takes (T = 0 and
T > 0), the first time it runs; inductor's on-disk cache makes later processes faster. The compiled
function computes what the eager one computes, up to float rounding of fused operations (tested).
"""

from __future__ import annotations

import functools
from typing import Callable

from pipeline.errors import ConfigError

# graphs Dynamo keeps per function before it gives up (fullgraph: fails); the default 8 is too few for a
# process that runs several configurations (a Hydra multirun over models and pools, T = 0 and T > 0)
RECOMPILE_LIMIT = 64


def _compile_failures() -> tuple[type, ...]:
    """The exception types of a failed compilation (not of a bug the tracing ran into)."""
    import torch._dynamo.exc as dynamo
    import torch._inductor.exc as inductor

    names = [(dynamo, "BackendCompilerFailed"), (dynamo, "Unsupported"), (dynamo, "FailOnRecompileLimitHit"),
             (dynamo, "FailOnCacheLimitHit"),  # its name before torch 2.7
             (inductor, "InductorError"), (inductor, "InvalidCxxCompiler"), (inductor, "CppCompileError")]
    return tuple(getattr(module, name) for module, name in names if hasattr(module, name))


def maybe_compiled(fn: Callable, enabled: bool, what: str, growing: dict[str, int] | None = None) -> Callable:
    """`fn` itself, or a torch.compile'd `fn` whose compilation failure (no C++ compiler on a CPU
    node, an unsupported backend or construct) is one clear line naming the option `what`. `growing`:
    {keyword argument: dimension} of tensors that grow between calls (a cache's buffers), compiled for any
    size there, so a buffer that grows costs no second compile."""
    if not enabled:
        return fn
    import torch

    config = torch._dynamo.config  # a process-wide setting: raised, never lowered
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"  # torch < 2.7
    setattr(config, name, max(getattr(config, name), RECOMPILE_LIMIT))
    compiled = torch.compile(fn, dynamic=None if growing else False, fullgraph=True)
    failures = _compile_failures()

    @functools.wraps(fn)
    def run(*args, **kwargs):
        for argument, dim in (growing or {}).items():
            torch._dynamo.mark_dynamic(kwargs[argument], dim)
        try:
            return compiled(*args, **kwargs)
        except failures as error:
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise ConfigError(f"{what}=true: torch.compile failed ({first}); set {what}=false") from error

    return run

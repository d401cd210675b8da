"""Optional `torch.compile` of a method's drafting loop: the loops whose per-step cost is the dispatch of
hundreds of tiny operations, not arithmetic (the Domino chain: ~25 small ops per drafted position).

Compiled, such a loop is one fused program: on this project's CPUs inductor emits C++ (the Domino chain
of the host-overhead model runs ~8x faster), on a GPU Triton kernels (fewer launches). Shapes are
static (`dynamic=False`): a loop sees one block size and one candidate-pool width per run, so it
compiles once per branch it takes (T = 0 and T > 0), the first time it runs; inductor's on-disk cache
makes later processes faster. A process that runs several configurations keeps a graph per shape (up
to 64 per function). The compiled function computes what the eager one computes, up to
float rounding of fused operations (tested).
"""

from __future__ import annotations

import functools
from typing import Callable

from pipeline.errors import ConfigError


def maybe_compiled(fn: Callable, enabled: bool, what: str) -> Callable:
    """`fn` itself, or a torch.compile'd `fn` whose compilation failure (no C++ compiler on a CPU
    node, an unsupported backend) is one clear line naming the option `what`."""
    if not enabled:
        return fn
    import torch

    # Dynamo keeps at most `recompile_limit` graphs per function (8 by default) and, with fullgraph, fails
    # past it: a process that runs several configurations (a Hydra multirun: models, pools, T = 0 and T > 0)
    # legitimately needs more specialisations than that
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    compiled = torch.compile(fn, dynamic=False, fullgraph=True)

    @functools.wraps(fn)
    def run(*args, **kwargs):
        try:
            return compiled(*args, **kwargs)
        except Exception as error:  # torch._dynamo / inductor failures of many types
            if "torch._dynamo" not in type(error).__module__ and "torch._inductor" not in type(error).__module__:
                raise
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise ConfigError(f"{what}=true: torch.compile failed ({first}); set {what}=false") from error

    return run

"""decoding/engine/compiled.py: off, the function itself; on, a compile failure is one ConfigError line."""

import pytest
import torch

from decoding.engine.compiled import maybe_compiled
from pipeline.errors import ConfigError


def branchy(x):
    if x.sum() > 0:  # data-dependent Python control flow: no full graph
        return x + 1
    return x - 1


def test_off_is_the_function_itself_and_a_failed_compile_is_one_line_naming_the_option():
    assert maybe_compiled(branchy, False, "method.compile") is branchy
    one_line = r"^method.compile=true: torch.compile failed \([^\n]*\); set method.compile=false$"
    with pytest.raises(ConfigError, match=one_line):
        maybe_compiled(branchy, True, "method.compile")(torch.ones(3))

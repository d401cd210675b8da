"""docs/adding-a-method.md's worked example, read from the page and run: its greedy output equals AR."""

import re
import sys
import types
from pathlib import Path

import torch

from decoding.engine.loop import generate
from decoding.methods.ar import AR

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "adding-a-method.md"


def load_example(monkeypatch) -> types.ModuleType:
    code = re.search(r"```python\n(.*?)```", GUIDE.read_text(), re.S).group(1)
    module = types.ModuleType("last_follow")
    monkeypatch.setitem(sys.modules, "last_follow", module)  # dataclasses look their module up
    exec(compile(code, str(GUIDE), "exec"), module.__dict__)  # noqa: S102 - our own docs page
    return module


def test_the_guide_example_is_lossless_and_drafts(tiny_llama, monkeypatch):
    module = load_example(monkeypatch)
    method = module.LastFollow(module.CONFIG())
    method.setup(tiny_llama)
    gen = torch.Generator().manual_seed(0)
    prompts = [[7, 30, 31, 32, 30, 31, 32, 30, 31]] + [torch.randint(6, 40, (12,), generator=gen).tolist()
                                                       for _ in range(3)]
    accepted = 0
    for prompt in prompts:  # a repetitive one (the tiny model's greedy text repeats it) and random ones
        ar = generate(AR(), tiny_llama, prompt, max_new_tokens=48).new_tokens
        state = generate(method, tiny_llama, prompt, max_new_tokens=48)
        assert state.new_tokens == ar
        assert state.stats.num_draft_tokens > 0
        accepted += state.stats.num_accepted_tokens
    assert accepted > 0

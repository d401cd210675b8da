"""The engine's step: what a method reads from the verification forward comes back with the verdict."""

import pytest
import torch

from decoding.engine.acceptance import accept_greedy
from decoding.engine.loop import DecodeState, Proposal, verify
from decoding.engine.tree import TokenTree


@pytest.mark.parametrize("rule", ["lossless", "a lossy rule's decide"])
def test_a_proposals_reads_come_back_with_the_step(tiny_target, rule):
    """`Proposal.reads(output)`: device tensors computed from the forward, their host values in `result.reads`
    (in the acceptance's copy; with a lossy `decide`, in a copy of their own), the verdict unchanged."""
    prompt = [7, 30, 31, 32, 33]
    tiny_target.prefill(prompt[:-1])
    state = DecodeState(tiny_target, prompt, 0.0, 8, set(), 0)
    seen = {}

    def reads(output):
        seen["logits"] = output.logits.clone()
        return output.logits.argmax(-1), output.logits[:, :2]

    tree = TokenTree.from_sequences(prompt[-1], [[40, 41], [42]])
    decide = (lambda tree, logits: accept_greedy(tree, logits)) if rule != "lossless" else None
    result = verify(state, Proposal(tree, reads=reads), decide=decide)
    logits = seen["logits"]
    assert result.reads[0] == logits.argmax(-1).tolist()
    assert result.reads[1] == pytest.approx(logits[:, :2].reshape(-1).tolist(), abs=0)
    assert result.verdict.bonus == int(logits[result.verdict.path[-1]].argmax())
    assert torch.equal(result.output.logits, logits)

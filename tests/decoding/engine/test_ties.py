"""Near-tie vs real divergence (decoding/engine/ties.py): on a constructed near-tie and a constructed wrong
token in fp32, and on real bf16 runs of every lossless method on a tiny model, where a correct
method may leave AR's output only where AR's two best logits (nearly) tie."""

import copy

import pytest
import torch

from decoding.methods.ar import AR
from decoding.engine.loop import generate
from decoding.engine.ties import diagnose, first_difference, tolerance


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 7]) == 2  # one output stopped earlier


def test_tolerance_scales_with_the_dtype_precision_and_the_logit_size():
    assert tolerance(torch.bfloat16, 20.0) == pytest.approx(20.0 / 32)
    assert tolerance(torch.float32, 20.0) < 1e-4
    assert tolerance(torch.bfloat16, 0.1) == tolerance(torch.bfloat16, 1.0)  # floor at |top| = 1


@pytest.fixture
def near_tie_target(tiny_llama):
    """The tiny llama with token b's output row equal to token a's: wherever a is AR's choice, b ties
    it exactly (argmax keeps the lower index, a)."""
    target = copy.deepcopy(tiny_llama)
    prompt = [7, 30, 31, 32, 33]
    ar = generate(AR(), target, prompt, max_new_tokens=12).new_tokens
    a = ar[4]
    with torch.inference_mode():
        logits = target.model(torch.tensor([prompt])).logits[0, -1]
    b = a + 1 + int(logits[a + 1:].argmin())  # a token AR never picks, after a
    head = target.model.get_output_embeddings().weight
    with torch.no_grad():
        head[b] = head[a]
    return target, prompt, a, b


def test_a_constructed_near_tie_is_a_tie_and_a_wrong_token_is_a_divergence(near_tie_target):
    target, prompt, a, b = near_tie_target
    ar = generate(AR(), target, prompt, max_new_tokens=12).new_tokens
    j = ar.index(a)
    tie = diagnose(target, prompt, ar, ar[:j] + [b] + ar[j + 1:])
    assert tie.position == j and tie.ar_token == a and tie.method_token == b
    assert tie.margin == 0.0 and tie.kind == "tie"
    with torch.inference_mode():
        target.prefill((prompt + ar[:j])[:-1])
        row = target.forward(torch.tensor([(prompt + ar[:j])[-1]]), torch.tensor([0]), None).logits[0]
    wrong = int(row.argmin())
    bug = diagnose(target, prompt, ar, ar[:j] + [wrong])
    assert bug.kind == "divergence" and bug.margin == pytest.approx(float(row[a] - row[wrong]), abs=1e-4)
    assert diagnose(target, prompt, ar, list(ar)) is None
    # an output that stops early (a prefix of the other) is never a rounding tie: both stop alike
    method_shorter = diagnose(target, prompt, ar, ar[:j])  # was a "tie": margin <= 0 against the top logit
    method_longer = diagnose(target, prompt, ar, ar + [a])
    for early, at in ((method_shorter, j), (method_longer, len(ar))):
        assert early.ended_early and early.kind == "divergence" and early.position == at


@pytest.fixture(scope="module")
def bf16_zoo(tmp_path_factory):
    from pipeline.zoo import random_target

    return random_target("tiny", dtype=torch.bfloat16), tmp_path_factory.mktemp("zoo_bf16")


def prompts_with_rejections():
    """Repetitive prompts (drafts get accepted) and random ones (drafts get rejected)."""
    gen = torch.Generator().manual_seed(3)
    random_prompts = [torch.randint(3, 500, (12,), generator=gen).tolist() for _ in range(3)]
    return [[7, 30, 31, 32, 7, 30, 31, 32, 7, 30], *random_prompts]


LOSSLESS_WITHOUT_DRAFTER_TRAINING = ["pld", "lookahead", "self_draft", "ptd", "ptd_forest", "sd", "sd_slim",
                                     "dflash", "ddtree", "caddtree", "domino", "dominotree", "dominotree_reference"]


@pytest.mark.parametrize("name", LOSSLESS_WITHOUT_DRAFTER_TRAINING)
def test_in_bf16_every_lossless_method_leaves_ar_only_at_near_ties(name, bf16_zoo, monkeypatch):
    from pipeline.zoo import build_method

    target, folder = bf16_zoo
    monkeypatch.setenv("SPECDEC_CACHE", str(folder))
    method = build_method(name, target, folder, max_budget=32, profile_node_counts=[0, 1, 2, 4, 8, 16, 32],
                          profile_context_lengths=[16, 64], profile_repeats=1) if name == "caddtree" else \
        build_method(name, target, folder)
    kinds = []
    for prompt in prompts_with_rejections():
        ar = generate(AR(), target, prompt, max_new_tokens=24).new_tokens
        out = generate(method, target, prompt, max_new_tokens=24)
        assert out.stats.num_draft_tokens > 0 or name in ("lookahead", "self_draft")
        found = diagnose(target, prompt, ar, out.new_tokens)
        kinds.append("equal" if found is None else found.kind)
        if found is not None:
            assert found.kind == "tie", (name, prompt, found)


@pytest.mark.parametrize("name", ["ar", "pld", "ptd", "sd", "spec_cascade", "via_sd", "dflash", "domino",
                                  "dominotree"])
def test_in_bf16_every_method_samples_at_t1(name, bf16_zoo, monkeypatch):
    from pipeline.zoo import build_method

    target, folder = bf16_zoo
    monkeypatch.setenv("SPECDEC_CACHE", str(folder))
    method = build_method(name, target, folder)
    prompt = prompts_with_rejections()[0]
    outs = [generate(method, target, prompt, max_new_tokens=16, temperature=1.0, seed=s).new_tokens for s in range(3)]
    assert all(len(o) == 16 for o in outs)
    assert len({tuple(o) for o in outs}) > 1  # different seeds, different samples
    assert generate(method, target, prompt, max_new_tokens=16, temperature=1.0, seed=0).new_tokens == outs[0]


def test_in_bf16_a_method_that_keeps_a_rejected_draft_is_caught_as_a_divergence(bf16_zoo, monkeypatch):
    """The diagnosis is not blind: greedy acceptance that keeps the first draft even when the target
    rejects it (a bug) gives divergences, not ties."""
    import decoding.engine.loop as engine
    from decoding.engine.acceptance import Verdict, accept_greedy
    from pipeline.zoo import build_method

    def keeps_a_rejected_draft(tree, logits, also=()):
        verdict = accept_greedy(tree, logits, also)
        if tree.children[0] and not verdict.num_accepted:
            return Verdict([0, tree.children[0][0]], verdict.bonus, verdict.reads)
        return verdict

    target, folder = bf16_zoo
    monkeypatch.setattr(engine, "accept_greedy", keeps_a_rejected_draft)
    method = build_method("pld", target, folder)
    kinds = []
    for prompt in prompts_with_rejections():
        ar = generate(AR(), target, prompt, max_new_tokens=24).new_tokens
        found = diagnose(target, prompt, ar, generate(method, target, prompt, max_new_tokens=24).new_tokens)
        kinds.append(found and found.kind)
    assert "divergence" in kinds

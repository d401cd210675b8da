"""VIA-SD: a token settled without the full model is distributed as q' (zones=note; zones=gated's untested
tier is not); forcing every token to the full verifier (zones=gated) reproduces sd exactly; zones A-B alone
never run the full model; the full model's KV after slim-settled tokens equals a fresh prefill."""

from types import SimpleNamespace

import pytest
import torch

from decoding.drafting.drafter import DrafterConfig
from decoding.engine.loop import generate
from decoding.drafting.routing import save_mask
from decoding.methods.sd import SDConfig, SpeculativeDecoding
from decoding.methods.via_sd import VIASD, VIASDConfig
from pipeline.errors import ConfigError

PROMPTS = [[7, 30, 31, 32], [40, 41, 42, 43, 44, 45], [60, 61, 7, 8]]


@pytest.fixture
def mask_file(tmp_path):
    path = tmp_path / "tiny_mask.json"
    save_mask(path, [2], num_layers=4, model="tiny")
    return str(path)


def make(cls, config, target):
    method = cls(config, drafter=DrafterConfig(exit_layer=2, gamma=4))
    method.setup(target)
    return method


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_thresholds_forcing_the_full_verifier_reproduce_sd(tiny_target, mask_file, temperature):
    sd = make(SpeculativeDecoding, SDConfig(), tiny_target)
    via = make(VIASD, VIASDConfig(mask=mask_file, zones="gated", agree_threshold=2.0, slim_threshold=2.0), tiny_target)
    for seed, prompt in enumerate(PROMPTS[:2]):
        a = generate(sd, tiny_target, prompt, max_new_tokens=16, temperature=temperature, seed=seed)
        b = generate(via, tiny_target, prompt, max_new_tokens=16, temperature=temperature, seed=seed)
        assert a.new_tokens == b.new_tokens
        assert b.stats.extra.get("settled_direct", 0) == b.stats.extra.get("settled_slim", 0) == 0
        assert b.stats.num_accepted_tokens == a.stats.num_accepted_tokens


@pytest.mark.parametrize("zones", ["note", "gated"])
def test_zones_a_and_b_alone_never_run_the_full_model(tiny_target, mask_file, zones):
    untested = {"agree_threshold": 0.0} if zones == "gated" else {}
    via = make(VIASD, VIASDConfig(mask=mask_file, zones=zones, slim_threshold=0.0, **untested), tiny_target)
    state = generate(via, tiny_target, PROMPTS[0], max_new_tokens=20, temperature=1.0, seed=1)
    assert len(state.new_tokens) == 20
    # every target pass was a slim one (3 of 4 layers): counted, at 3/4 of a full forward each
    slim = state.stats.extra["slim_forwards"]
    assert state.stats.target_forwards == slim
    assert state.stats.target_forward_cost == pytest.approx(0.75 * slim)
    assert state.stats.decoding_efficiency == pytest.approx(20 / (0.75 * slim))
    # the early-exit drafter (2 of 4 layers) reports its own cost in the same units
    assert state.stats.extra["drafter_forward_cost"] == pytest.approx(0.5 * state.stats.extra["drafter_forwards"])
    assert state.stats.extra["settled_direct"] + state.stats.extra["settled_slim"] == 20


def cache_tensors(target, length):
    return [(layer.keys[:, :, :length], layer.values[:, :, :length]) for layer in target.cache.layers]


@pytest.mark.parametrize("zones", ["note", "gated"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_full_kv_after_slim_settled_tokens_equals_a_fresh_prefill(tiny_target, mask_file, temperature, zones):
    untested = {"agree_threshold": 0.05} if zones == "gated" else {}
    via = make(VIASD, VIASDConfig(mask=mask_file, zones=zones, slim_threshold=0.1, **untested), tiny_target)
    slim_settled: set[int] = set()

    def watch(state):  # positions committed while the target's cache lagged behind
        slim_settled.update(range(state.target.cache_len, len(state.sequence) - 1))

    state = generate(via, tiny_target, PROMPTS[1], max_new_tokens=40, temperature=temperature, seed=0, on_step=watch)
    target = tiny_target
    length = target.cache_len
    assert state.stats.extra.get("escalations", 0) > 0
    assert any(pos < length for pos in slim_settled), "no slim-settled token was filled by a later full pass"
    got = cache_tensors(target, length)
    target.prefill(state.sequence[:length])
    for (k, v), (k0, v0) in zip(got, cache_tensors(target, length)):
        torch.testing.assert_close(k, k0, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(v, v0, atol=1e-5, rtol=1e-4)


def test_random_mask_ablation_keeps_the_skip_count(tiny_llama, mask_file):
    via = make(VIASD, VIASDConfig(mask=mask_file, middle="random", random_seed=3), tiny_llama)
    assert len(via.slim_layers) == 3 and via.slim_layers[0] == 0 and via.slim_layers[-1] == 3


def test_independent_middle_model_ablation_runs(tiny_llama, tiny_model_dirs):
    from pipeline.models import ModelConfig

    cfg = VIASDConfig(middle="model", middle_model=ModelConfig(name="tiny-qwen3", path=str(tiny_model_dirs["qwen3"])),
                      slim_threshold=0.06)
    state = generate(make(VIASD, cfg, tiny_llama), tiny_llama, PROMPTS[2], max_new_tokens=16, seed=0)
    assert len(state.new_tokens) == 16


def test_bad_config_values_are_one_line_errors(tiny_llama):
    with pytest.raises(ConfigError, match="method.agreement"):
        VIASDConfig(zones="gated", agreement="js")
    with pytest.raises(ConfigError, match="method.zones"):
        VIASDConfig(zones="paper")
    with pytest.raises(ConfigError, match="zones=gated"):  # a threshold that would have no effect
        VIASDConfig(agree_threshold=0.7)
    with pytest.raises(ConfigError, match="not found"):
        make(VIASD, VIASDConfig(mask="no-such-mask"), tiny_llama)


def plan_many(zones: str, p_row, s_row, slim_threshold: float, n: int = 40000, seed: int = 0):
    """n independent positions with the same p and q' rows in one `plan` call (each is decided alone):
    the drafts x ~ p and the plan."""
    from decoding.engine.sampling import Sampler

    via = VIASD(VIASDConfig(zones=zones, slim_threshold=slim_threshold))
    p = torch.tensor(p_row, dtype=torch.float64).expand(n, -1)
    s = torch.tensor(s_row, dtype=torch.float64).expand(n + 1, -1)
    drafts = torch.multinomial(p, 1, replacement=True, generator=torch.Generator().manual_seed(seed))[:, 0].tolist()
    state = SimpleNamespace(sampler=Sampler(seed + 1, "cpu"), greedy=False)
    return drafts, via.plan(state, drafts, p, s)


def emitted_at_one_position(zones: str, p_row, s_row) -> torch.Tensor:
    """The token a position emits when zone C is closed (max q' >= τ_slim = 0), as frequencies: the
    plan keeps x or q' regenerates."""
    drafts, plan = plan_many(zones, p_row, s_row, slim_threshold=0.0)
    assert all(keep or regen for keep, regen in zip(plan["keep"], plan["regenerate"]))
    emitted = [x if keep else r for x, keep, r in zip(drafts, plan["keep"], plan["regen"])]
    return torch.bincount(torch.tensor(emitted), minlength=len(p_row)).double() / len(drafts)


# q' and p agree on token 0 with high confidence, p more so than q' (the case where they differ)
Q_SLIM, P_DRAFT = [0.75, 0.2, 0.05], [0.95, 0.03, 0.02]


def test_zones_a_and_b_emit_the_slim_verifiers_distribution():
    """zones=note: every kept draft passed the test against q', so with the residual draw the position
    is a speculative-sampling step against q': the emitted token is distributed as q'."""
    freq = emitted_at_one_position("note", P_DRAFT, Q_SLIM)
    torch.testing.assert_close(freq, torch.tensor(Q_SLIM, dtype=torch.float64), atol=0.01, rtol=0)


def test_the_gated_reconstructions_untested_tier_emits_the_drafters_token_instead():
    """zones=gated keeps x = argmax q' untested when min(p(x), q'(x)) >= τ_agree (0.7): here it emits
    token 0 with p's probability 0.95, not q''s 0.75 (the departure its docstring states)."""
    freq = emitted_at_one_position("gated", P_DRAFT, Q_SLIM)
    assert abs(freq[0].item() - 0.95) < 0.01 and abs(freq[0].item() - 0.75) > 0.1


def test_a_draft_reaching_zone_c_is_distributed_as_the_row_the_full_verifier_gets():
    """zones=note at T > 0 with zone B closed: the drafts that fail the test against q' go to the full
    verifier; given that, x is distributed as norm(max(0, p - q')) (`zone_c_rows`), not as p (here p > q'
    at two tokens: [.6, .4, 0], where p restricted to them would be [.556, .444, 0]), so the engine's
    speculative step against that row emits exactly q's draw there."""
    p_row, s_row = [0.5, 0.4, 0.1], [0.2, 0.2, 0.6]
    drafts, plan = plan_many("note", p_row, s_row, slim_threshold=2.0)
    escalated = torch.tensor([x for x, keep in zip(drafts, plan["keep"]) if not keep])
    freq = torch.bincount(escalated, minlength=3).double() / len(escalated)
    row = VIASD.zone_c_rows(torch.tensor([p_row]), torch.tensor([s_row]), 0)[0].double()
    torch.testing.assert_close(row, torch.tensor([0.6, 0.4, 0.0], dtype=torch.float64))
    torch.testing.assert_close(freq, row, atol=0.01, rtol=0)
    assert abs(len(escalated) / len(drafts) - (1 - sum(map(min, p_row, s_row)))) < 0.01


def test_zone_c_hands_the_full_verifier_that_row(tiny_target, mask_file, monkeypatch):
    """In decoding (T = 1, zone B closed), every escalated chain's first row is `zone_c_rows` of the
    drafter's and q''s rows at that position, and the rows after it are the drafter's."""
    import decoding.methods.via_sd as via_sd_module

    via = make(VIASD, VIASDConfig(mask=mask_file, slim_threshold=2.0), tiny_target)
    seen, real_verify, real_plan = [], via_sd_module.verify, via.plan

    def planning(state, drafts, p, s):
        seen.append({"p": p, "s": s})
        return real_plan(state, drafts, p, s)

    def verifying(state, proposal, **kwargs):
        seen[-1]["rows"] = torch.stack(proposal.tree.draft_probs[1:])
        return real_verify(state, proposal, **kwargs)

    monkeypatch.setattr(via, "plan", planning)
    monkeypatch.setattr(via_sd_module, "verify", verifying)
    generate(via, tiny_target, PROMPTS[1], max_new_tokens=24, temperature=1.0, seed=0)
    escalated = [step for step in seen if "rows" in step]
    assert escalated
    for step in escalated:
        i = len(step["p"]) - len(step["rows"])
        want = VIASD.zone_c_rows(step["p"], step["s"], i)[i:]
        torch.testing.assert_close(step["rows"], want.to(step["rows"].dtype))
        assert not torch.allclose(step["rows"][0], step["p"][i])  # the row changed


@pytest.mark.parametrize("zones, expected", [("note", "keep"), ("gated", "escalate")])
def test_greedy_zones_on_a_draft_q_prime_picks_without_confidence(zones, expected):
    """T = 0, x = argmax q' with q'(x) = 0.4 < τ_slim = 0.5: zones=note keeps it (zone A tests it and it
    passes); zones=gated neither keeps it untested (min(p, q') = 0.4 < 0.7) nor tests it (q' is not
    confident), so it escalates. A draft q' does not pick is regenerated where q' is confident."""
    from decoding.engine.sampling import Sampler

    p = torch.tensor([[0.6, 0.3, 0.1], [0.6, 0.3, 0.1]])
    s = torch.tensor([[0.4, 0.35, 0.25], [0.1, 0.8, 0.1], [0.2, 0.3, 0.5]])
    via = VIASD(VIASDConfig(zones=zones))
    plan = via.plan(SimpleNamespace(sampler=Sampler(0, "cpu"), greedy=True), [0, 0], p, s)
    assert plan["keep"][0] == (expected == "keep") and not plan["regenerate"][0]
    assert not plan["keep"][1] and plan["regenerate"][1] and plan["regen"][1] == 1  # q' confident, picks 1
    assert plan["bonus"] == [2]

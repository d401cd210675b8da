"""Metrics every method shares: τ counts the tokens a step committed, not drafts accepted past a stop
token or the token limit (which inflated it by up to a block on the last step)."""

import pytest

from decoding.engine.loop import generate
from pipeline.zoo import METHODS, build_method, mixed_prompts, random_target


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    return random_target("tiny"), tmp_path_factory.mktemp("zoo_metrics")


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("name", METHODS)
def test_tau_times_steps_is_the_tokens_generated_when_the_limit_cuts_a_step(name, temperature, zoo):
    target, folder = zoo
    method = build_method(name, target, folder)
    prompt = mixed_prompts(1, 500)[0]  # repetitive: long accepted runs, so the limit cuts one
    limit = 13
    stats = generate(method, target, prompt, max_new_tokens=limit, temperature=temperature, seed=1).stats
    assert stats.new_tokens == limit
    assert stats.tau * stats.num_steps == pytest.approx(limit)
    assert sum(stats.num_accepted_tokens_per_pos) == stats.num_accepted_tokens

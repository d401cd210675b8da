"""Metrics every method shares: τ counts the tokens a step committed, not drafts accepted past a stop
token or the token limit (which inflated it by up to a block on the last step)."""

import pytest

from decoding.engine.loop import committed_drafts, generate
from decoding.methods.ar import AR
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


@pytest.mark.parametrize("name", METHODS)
def test_tau_times_steps_is_the_tokens_generated_when_a_stop_token_cuts_a_step(name, zoo):
    target, folder = zoo
    prompt = mixed_prompts(1, 500)[0]
    ar = generate(AR(), target, prompt, max_new_tokens=24).new_tokens
    stop = ar[9]  # mid-answer: inside an accepted run of the repetitive text
    stats = generate(build_method(name, target, folder), target, prompt, max_new_tokens=24, stop_ids={stop}).stats
    assert stats.tau * stats.num_steps == pytest.approx(stats.new_tokens)


def test_committed_drafts_counts_the_committed_tokens_but_the_bonus_place():
    assert committed_drafts(3, [1, 2, 3, 9]) == 3  # all drafts and the bonus
    assert committed_drafts(3, [1, 0]) == 1  # a stop token (0) among the drafts: it takes the bonus's place
    assert committed_drafts(3, [1, 2, 3]) == 2  # the limit cut the bonus: the last draft takes its place
    assert committed_drafts(0, [9]) == 0 and committed_drafts(2, []) == 0

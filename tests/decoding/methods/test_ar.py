import torch

from decoding.methods.ar import AR
from decoding.engine.loop import generate


def hf_greedy(target, prompt, n):
    with torch.inference_mode():
        out = target.model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, min_new_tokens=n,
                                    eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def test_ar_greedy_equals_hf_generate(tiny_target):
    prompt = [7, 30, 31, 32, 33, 34]
    state = generate(AR(), tiny_target, prompt, max_new_tokens=40)
    assert state.new_tokens == hf_greedy(tiny_target, prompt, 40)
    stats = state.stats
    assert stats.new_tokens == 40 and stats.target_forwards == 40 and stats.tau == 1.0
    assert stats.decoding_efficiency == 1.0


def test_stops_at_stop_token_inclusive(tiny_llama):
    prompt = [7, 30, 31, 32]
    full = generate(AR(), tiny_llama, prompt, max_new_tokens=30).new_tokens
    stop = full[10]
    first = full.index(stop)
    state = generate(AR(), tiny_llama, prompt, max_new_tokens=30, stop_ids={stop})
    assert state.new_tokens == full[: first + 1]


def test_sampling_is_reproducible_per_seed(tiny_llama):
    prompt = [7, 30, 31, 32]
    a = generate(AR(), tiny_llama, prompt, max_new_tokens=20, temperature=1.0, seed=3).new_tokens
    b = generate(AR(), tiny_llama, prompt, max_new_tokens=20, temperature=1.0, seed=3).new_tokens
    c = generate(AR(), tiny_llama, prompt, max_new_tokens=20, temperature=1.0, seed=4).new_tokens
    assert a == b and a != c

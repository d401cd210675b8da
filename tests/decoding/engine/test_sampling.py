"""The one sampling path (decoding/engine/sampling.py): draws on the probabilities' own device, one
per-prompt seed, and no other randomness in the decoding loop."""

from types import SimpleNamespace

import pytest
import torch
from scipy.stats import chisquare

from decoding.engine.loop import DecodeState, generate
from decoding.engine.sampling import Sampler
from decoding.engine.transfer import to_host


def test_decode_state_samples_on_the_device_of_the_targets_logits():
    """The T>0 crash on CUDA: a CPU torch.Generator drew from CUDA probabilities. The per-prompt
    sampler must live where the logits come out; no CUDA is needed to check that contract."""
    target = SimpleNamespace(output_device=torch.device("cuda", 0), device=torch.device("cuda", 0))
    state = DecodeState(target, [1, 2, 3], temperature=1.0, max_new_tokens=4, stop_ids=set(), seed=5)
    assert state.sampler.device == torch.device("cuda", 0)


def test_a_tensor_from_another_device_is_refused_with_one_line():
    """What CUDA does to a CPU generator, enforced on every device so CPU tests see the mistake."""
    sampler = Sampler(0, "cuda:0")  # the generator is made at the first draw, so no CUDA is touched
    with pytest.raises(ValueError, match=r"tensor on cpu with a sampler for cuda:0.*for_device"):
        sampler.categorical(torch.full((4,), 0.25))


def test_for_device_gives_a_sampler_on_that_device_with_its_own_seed():
    sampler = Sampler(7, "cuda:0")
    assert sampler.for_device("cuda") is sampler
    other = sampler.for_device("cuda:1")
    assert other.device == torch.device("cuda", 1) and sampler.for_device("cuda:1") is other
    # equal seeds on two CUDA devices are one Philox stream: a drafter there would draw with the
    # target's own uniforms. Each device's seed is its own, and reproducible from the prompt seed.
    seeds = {sampler.seed, other.seed, sampler.for_device("cuda:2").seed, sampler.for_device("cpu").seed}
    assert len(seeds) == 4
    assert Sampler(7, "cuda:0").for_device("cuda:1").seed == other.seed


def test_same_seed_same_draws_and_named_streams_are_independent():
    probs = torch.softmax(torch.randn(3, 50, generator=torch.Generator().manual_seed(0)), -1)
    a, b = Sampler(3), Sampler(3)
    assert torch.equal(a.categorical(probs), b.categorical(probs))
    assert torch.equal(a.uniform(5), b.uniform(5))
    # drawing from a named stream does not move the main stream
    c, d = Sampler(3), Sampler(3)
    c.stream("via_sd").uniform(100)
    assert torch.equal(c.uniform(4), d.uniform(4))


def test_categorical_follows_the_distribution_and_never_picks_zero_mass():
    p = torch.tensor([0.5, 0.0, 0.2, 0.3, 0.0])
    sampler = Sampler(1)
    draws = sampler.categorical(p.expand(20000, 5).contiguous())
    counts = torch.bincount(draws, minlength=5)
    assert counts[1] == 0 and counts[4] == 0
    assert chisquare(counts[[0, 2, 3]].numpy(), (p[[0, 2, 3]] * 20000).numpy()).pvalue > 1e-3
    assert sampler.categorical(torch.tensor([0.0, 3.0, 1.0])).shape == ()  # unnormalised rows are fine


def test_categorical_with_predrawn_uniforms_picks_as_the_inverse_cdf_and_leaves_them_unchanged():
    """A loop that draws a round's uniforms first (the Domino chain, the drafter loop) gets the index whose
    running sum first exceeds u * total, and its uniforms are not modified."""
    sampler = Sampler(2)
    p = torch.tensor([0.1, 0.0, 0.6, 0.3])
    u = torch.tensor([0.05, 0.1, 0.11, 0.69, 0.71, 0.999], dtype=torch.float64)
    kept = u.clone()
    picks = [int(sampler.categorical(p, u[i])) for i in range(len(u))]
    assert picks == [0, 2, 2, 2, 3, 3]
    assert torch.equal(u, kept)
    rows = sampler.categorical(p.expand(2, 4).contiguous(), u[[0, 4]])
    assert rows.tolist() == [0, 3]


@pytest.mark.parametrize("temperature", [0.5, 1.0])
def test_gumbel_max_draws_follow_the_softmax_at_temperature(temperature):
    """argmax(logits + T g) with g = sampler.gumbel(...) is a draw from softmax(logits / T): how the Domino
    chain samples its positions. A masked (-inf) logit is never drawn; the noise is float64, reproducible."""
    logits = torch.tensor([1.0, float("-inf"), 0.2, -0.5, 2.0])
    sampler = Sampler(4)
    noise = sampler.gumbel((40000, 5))
    assert noise.dtype == torch.float64 and torch.equal(noise[:3], Sampler(4).gumbel((3, 5)))
    draws = (logits + temperature * noise).argmax(-1)
    counts = torch.bincount(draws, minlength=5)
    p = torch.softmax(logits.double() / temperature, -1)
    assert counts[1] == 0
    assert chisquare(counts[[0, 2, 3, 4]].numpy(), (p[[0, 2, 3, 4]] * 40000).numpy()).pvalue > 1e-3


def test_chain_draws_pick_argmax_or_inverse_cdf_from_the_chains_uniforms_and_return_their_rows():
    """ChainDraws, the sampling of every drafter loop: T = 0 is the argmax, with T = 1 distributions only on request;
    T > 0 draws position i with the i-th of the uniforms drawn at the start (the same picks as categorical with
    them) and returns exactly the rows it drew from."""
    from decoding.engine.sampling import ChainDraws, probabilities

    logits = torch.randn(4, 9, generator=torch.Generator().manual_seed(1))
    greedy = ChainDraws(Sampler(0), 4, 0.0)
    assert [int(greedy.pick(row)) for row in logits] == logits.argmax(-1).tolist()
    assert greedy.distributions(needed=False) is None
    torch.testing.assert_close(greedy.distributions(), torch.softmax(logits, -1))
    draws = ChainDraws(Sampler(5), 4, 0.7)
    picks = [int(draws.pick(row)) for row in logits]
    uniforms, sampler = Sampler(5).uniform(4, torch.float64), Sampler(5)
    want = [int(sampler.categorical(probabilities(row, 0.7), uniforms[i])) for i, row in enumerate(logits)]
    assert picks == want
    torch.testing.assert_close(draws.distributions(needed=False), probabilities(logits, 0.7))


def test_to_host_is_one_copy_of_mixed_tensors():
    ints, flags, floats = to_host(torch.tensor([3, 70000]), torch.tensor([True, False]), torch.tensor([0.5]))
    assert ints == [3, 70000] and flags == [1, 0] and floats == [0.5]
    assert all(isinstance(v, int) for v in ints)


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    from pipeline.zoo import random_target

    return random_target("tiny"), tmp_path_factory.mktemp("zoo")


@pytest.mark.parametrize("method_name", ["ar", "pld", "ptd", "sd", "spec_cascade", "via_sd", "dflash", "domino",
                                         "dominotree"])
def test_all_randomness_of_a_sampled_run_goes_through_the_sampler(method_name, zoo, monkeypatch):
    """torch's random functions raise outside decoding/engine/sampling.py (which keeps its own view of
    torch here), so a method that draws with some other generator fails."""
    import decoding.engine.sampling as sampling
    from pipeline.zoo import build_method

    target, folder = zoo
    monkeypatch.setenv("SPECDEC_CACHE", str(folder))
    method = build_method(method_name, target, folder)

    def forbidden(*args, **kwargs):
        raise AssertionError("randomness outside decoding.engine.sampling")

    monkeypatch.setattr(sampling, "torch", SimpleNamespace(**{k: getattr(torch, k) for k in dir(torch)
                                                              if not k.startswith("__")}))
    for name in ("multinomial", "rand", "randint", "randn", "bernoulli", "poisson", "normal"):
        monkeypatch.setattr(torch, name, forbidden)
    for name in ("exponential_", "uniform_", "random_", "normal_", "bernoulli_", "geometric_"):
        monkeypatch.setattr(torch.Tensor, name, forbidden)
    state = generate(method, target, [7, 30, 31, 32, 7, 30], max_new_tokens=12, temperature=1.0, seed=4)
    assert len(state.new_tokens) == 12

"""Host work in the hot loop: device->host reads per decoding step are counted (each is a host-device
sync on a GPU), and the engine's cache and prefill paths do no whole-cache or whole-vocabulary work.
(What else a GPU would pay for in the loop: test_host_work.py.)"""

import pytest


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    from pipeline.zoo import random_target

    return random_target("tiny"), tmp_path_factory.mktemp("zoo_syncs")


def reads(method, target, temperature) -> dict:
    """pipeline.step_probes.host_reads (the rule: host_reads_in) on one prompt."""
    from pipeline.step_probes import host_reads

    return host_reads(method, target, [7, 30, 31, 32, 33, 34] * 4, max_new_tokens=24, temperature=temperature,
                      seed=1, top=20)


# device->host reads allowed per step: drafting (one copy of the drafted tokens) + acceptance (one, which
# also brings what a method reads back from the forward's rows: Proposal.reads). Before: Domino ~32 per step
# (per-position int(argmax) and a host tensor per token), PTD one per forest node, then one beside the
# acceptance's (as Lookahead and Self-Draft, until 2026-12-07), VIA-SD 4-6 per position, sampling acceptance
# 2-3 per child.
BOUNDS = {"ar": 1, "pld": 1, "lookahead": 1, "self_draft": 1, "ptd": 1, "ptd_forest": 1, "sd": 2, "spec_cascade": 2,
          "via_sd": 3, "via_sd_eagle3": 3, "sd_slim": 2, "eagle3": 2,
          "dflash": 2, "ddtree": 2, "caddtree": 2, "domino": 2}


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("name", sorted(BOUNDS))
def test_device_to_host_reads_per_step_are_bounded(name, temperature, zoo, monkeypatch):
    from pipeline.zoo import build_method

    target, folder = zoo
    monkeypatch.setenv("SPECDEC_CACHE", str(folder))
    method = build_method(name, target, folder)
    counted = reads(method, target, temperature)
    assert 1 <= counted["reads_per_step"] <= BOUNDS[name]  # at least one: the host learns what was accepted
    # the whole generation: prefill, begin, the first step and finish add at most one read per two steps
    assert counted["all_reads"] / counted["all_steps"] <= BOUNDS[name] + 0.5


def test_dominotree_reads_once_per_depth_not_per_node(zoo):
    """The level builder reads the host once per depth it expands (the live lane count), plus the
    tree once: per step at most the deepest tree's depth + 1, plus drafting and acceptance."""
    from pipeline.zoo import build_method

    target, folder = zoo
    method = build_method("dominotree", target, folder)
    depths = []
    real = method.propose

    def propose(state):
        proposal = real(state)
        depths.append(max(proposal.tree.depths))
        return proposal

    method.propose = propose
    per_step = reads(method, target, 0.0)["reads_per_step"]
    assert depths and per_step <= max(depths) + 1 + 3
    assert per_step < method.config.num_nodes  # the node-by-node builder read once per expanded node


def test_the_read_counter_sees_every_kind_of_read_at_its_line(zoo):
    """AR (one read per step) with a propose that also reads the host once per step in each way the rule knows,
    twice through a two-tensor index: 17 reads per step, 16 of them charged to this file's lines."""
    import numpy as np
    import torch

    from pipeline.zoo import build_method

    target, folder = zoo
    method = build_method("ar", target, folder)
    real, t, v = method.propose, torch.tensor(2), torch.arange(5)

    def propose(state):
        int(t), float(t), bool(t), t.item(), v.tolist(), range(t), v.cpu(), v.numpy()  # 8 reads
        np.asarray(v), f"{t}", repr(v), 3 in v  # 4 reads inside torch's Python, charged here
        v[t], v.clone().__setitem__(t, 0)  # 2 reads
        v.view(1, 5)[t - t, t]  # 2 reads
        return real(state)

    method.propose = propose
    counted = reads(method, target, 0.0)
    here = {site: n for site, n in counted["sites"].items() if site.startswith("decoding/test_host_syncs.py:")}
    assert counted["reads_per_step"] == 17.0 and sorted(here.values()) == [2.0, 2.0, 4.0, 8.0]


def test_prefill_computes_logits_for_the_last_row_only_even_with_hidden_taps(tiny_llama):
    out = tiny_llama.prefill(list(range(10, 30)), hidden_layers=(0, 2))
    assert out.logits.shape == (1, tiny_llama.config.vocab_size)
    assert out.hidden[0].shape[0] == 20 and out.hidden[2].shape[0] == 20


def test_keep_rows_compacts_in_place_without_copying_a_layer(tiny_llama):
    from decoding.engine.tree import TokenTree

    target = tiny_llama
    target.prefill(list(range(10, 40)))
    target.forward_tree(TokenTree.from_sequences(40, [[41, 42], [43, 44, 45]]))
    before = [layer.keys.data_ptr() for layer in target.cache.layers]
    target.keep_rows(30, [0, 3, 4, 5])  # root + the second branch: rows move down, in place
    assert [layer.keys.data_ptr() for layer in target.cache.layers] == before
    assert target.cache_len == 34


def test_the_ptd_pool_walks_a_trie_only_to_evict(monkeypatch):
    from decoding.drafting.ptd_tree import TriePool

    walks = []
    real = TriePool.branches
    monkeypatch.setattr(TriePool, "branches", lambda self, root: walks.append(root) or real(self, root))
    pool = TriePool(cap=4)
    for step, tok in enumerate((1, 2, 3)):
        pool.merge(0, {tok: {}}, step)
    assert walks == []  # three branches under a cap of four: no walk
    with pool.batch():
        for step, tok in enumerate((4, 5, 6), start=3):
            pool.merge(0, {tok: {}}, step)
    assert walks == [0] and pool.leaves[0] == 4  # one eviction walk for the whole step


"""DIMR mask search on a tiny model: the KL cost is zero for the full model and positive for a
slim one, every trial skips exactly k inner layers, known masks run first, the journal resumes."""

import pytest

from decoding.routing import load_mask, save_mask
from search.dimr import MaskCost, known_masks, search


@pytest.fixture
def cost(tiny_llama):
    return MaskCost(tiny_llama, [[10, 11, 12, 13, 14, 15, 16, 17], [20, 21, 22, 23, 24]])


def test_cost_is_zero_without_skipping_and_positive_with(cost):
    assert cost(()) == pytest.approx(0.0, abs=1e-5)
    assert cost((1,)) > 1e-4
    assert cost((1, 2)) == cost((2, 1))  # cached by mask


def test_search_enqueues_known_masks_keeps_k_and_resumes(cost, tmp_path):
    journal = tmp_path / "dimr.journal"
    study = search(cost, k=1, trials=4, sampler="random", storage_path=journal, study_name="t")
    skips = [tuple(t.user_attrs["skip"]) for t in study.trials]
    assert skips[:2] == known_masks(4, 1)
    assert all(len(s) == 1 and 0 not in s and 3 not in s for s in skips)
    assert study.best_value == min(cost(s) for s in skips)
    again = search(cost, k=1, trials=4, sampler="random", storage_path=journal, study_name="t")
    assert len(again.trials) == 4  # resumed from the journal, nothing re-run


def test_mask_file_round_trip_and_layer_count_check(tmp_path):
    from pipeline.errors import ConfigError

    path = tmp_path / "m.json"
    save_mask(path, [5, 2], num_layers=8, model="x")
    assert load_mask(str(path), 8) == (2, 5)
    with pytest.raises(ConfigError, match="8-layer"):
        load_mask(str(path), 30)
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="malformed"):
        load_mask(str(path), 8)

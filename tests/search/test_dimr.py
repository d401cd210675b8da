"""DIMR mask search as `python -m search objective=dimr` on a tiny 6-layer llama: the KL cost is zero for
the full model and positive for a slim one; topk trials skip exactly k inner layers, bool trials outside
the skip-ratio range are pruned; known masks run first and a journal study resumes; a pareto study has two
directions; the exported file loads through decoding.drafting.routing like the shipped mask."""

import json

import optuna
import pytest
import torch
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf
from optuna.trial import TrialState

from decoding.drafting.routing import load_mask, save_mask
from pipeline.cli import first_config_problem
from pipeline.errors import ConfigError
from search.dimr import MaskCost, known_masks
from search.study import register_configs, run_study

register_configs()
LAYERS = 6  # inner layers 1..4


@pytest.fixture(scope="module")
def six_layer_dir(tiny_model_dirs, tmp_path_factory):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(tiny_model_dirs["llama"])
    config.num_hidden_layers = LAYERS
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny_llama6")
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(path)
    AutoTokenizer.from_pretrained(tiny_model_dirs["llama"]).save_pretrained(path)
    return path


@pytest.fixture
def dimr_cfg(six_layer_dir, tmp_path):
    def make(n_trials, *overrides):
        GlobalHydra.instance().clear()
        with initialize_config_module(config_module="conf", version_base="1.3"):
            cfg = compose("search", overrides=[
                "objective=dimr", "model.name=tiny6", f"model.path={six_layer_dir}", "model.source=hub", "model.dtype=float32",
                "tracker=none", "sampler=random", f"n_trials={n_trials}", f"storage={tmp_path / 'dimr.journal'}",
                "show_progress=false", "objective.calibration_prompts=2", "objective.calibration_tokens=8",
                "objective.skip=2", f"objective.export_dir={tmp_path / 'masks'}", *overrides])
        return OmegaConf.to_object(cfg)
    return make


def load(cfg):
    from search.study import make_storage

    return optuna.load_study(study_name=cfg.study_name, storage=make_storage(cfg))


def test_cost_is_zero_without_skipping_and_positive_with(tiny_llama):
    cost = MaskCost(tiny_llama, [[10, 11, 12, 13, 14, 15, 16, 17], [20, 21, 22, 23, 24]])
    assert cost(()) == pytest.approx(0.0, abs=1e-5)
    assert cost((1,)) > 1e-4
    assert cost((1, 2)) == cost((2, 1))  # cached by mask


@pytest.mark.parametrize("arch", ["llama", "gemma3"])  # gemma3: 8-token sliding windows, crossed by the blocks
def test_decode_calibration_is_the_slim_pass_over_the_full_models_prefix(arch):
    """block=b: row t of q_z comes from a pass through the kept layers over the block of b rows holding t,
    on top of the full model's KV of every earlier block (computed here block by block from a fresh
    prefill of each prefix); zero without skipping, and not the cost of the slim model from scratch.
    The cost restores a snapshot of the full model's cache of the whole sequence, once per sequence (llama)
    or again where a sliding layer cut to a later block kept only its window (gemma3); a second mask must
    not see the first's passes."""
    import torch

    from decoding.engine.target import TargetModel
    from decoding.drafting.routing import kept_layers
    from pipeline.zoo import random_target

    target = random_target("tiny", arch=arch)
    gen = torch.Generator().manual_seed(1)
    seqs = [torch.randint(3, 500, (n,), generator=gen).tolist() for n in (22, 13)]
    starts, block = [9, 0], 3
    cost = MaskCost(target, seqs, block=block, starts=starts)
    restores = []
    restore = cost.full.restore
    cost.full.restore = lambda snapshot: (restores.append(snapshot), restore(snapshot))

    def fresh(skip):
        layers = kept_layers(skip, target.num_layers)
        total, count = 0.0, 0
        for seq, start in zip(seqs, starts):
            full = TargetModel(target.model)
            ref = MaskCost._logprobs(full, seq)
            for c in range(start, len(seq), block):
                full.reset()
                if c:
                    full.forward(torch.tensor(seq[:c]), torch.arange(c), None)
                rows = seq[c:c + block]
                logq = torch.log_softmax(full.forward(rows, list(range(len(rows))), None,
                                                      active_layers=layers).logits, -1)
                total += float((ref[c:c + block].exp() * (ref[c:c + block] - logq)).sum())
                count += len(rows)
        return total / count

    assert cost(()) == pytest.approx(0.0, abs=1e-5)
    # one restore per sequence; with 8-token windows, again wherever a block needs keys the last cut dropped
    assert len(restores) == (2 if arch == "llama" else 5 + 3)
    for skip in [(1,), (2, 3), (1,)]:  # cached by mask the third time
        assert cost(skip) == pytest.approx(fresh(skip), rel=1e-4)
    assert cost((1,)) != pytest.approx(MaskCost(target, seqs)((1,)), rel=1e-2)


def test_topk_study_resumes_with_known_masks_first_and_exports_a_loadable_mask(dimr_cfg, tmp_path):
    cfg = dimr_cfg(3)
    assert cfg.study_name == "dimr-tiny6-kl-topk-k2" and cfg.objective.export_name == "tiny6-dimr"
    assert run_study(cfg)["finished_trials"] == 3
    resumed = run_study(dimr_cfg(5))
    assert resumed["finished_trials"] == 5 and resumed["recovered_stale_trials"] == 0
    trials = load(cfg).trials
    assert len(trials) == 5 and all(t.state == TrialState.COMPLETE for t in trials)
    skips = [tuple(t.user_attrs["skip"]) for t in trials]
    assert skips[:2] == known_masks(LAYERS, 2) == [(1, 3), (3, 4)]  # enqueued first, not enqueued again
    assert all(len(s) == 2 and set(s) <= {1, 2, 3, 4} for s in skips)  # first/last layer kept
    assert [t.value for t in trials] == [t.user_attrs["kl"] for t in trials]

    path = tmp_path / "masks" / "tiny6-dimr.json"
    data = json.loads(path.read_text())
    best = min(trials, key=lambda t: t.value)
    assert load_mask(str(path), LAYERS) == tuple(best.user_attrs["skip"])
    assert data["cost_kl"] == pytest.approx(best.value) and data["model"] == "tiny6"
    curve = data["search"]["best_so_far"]
    assert len(curve) == 5 and curve == sorted(curve, reverse=True)
    assert curve[-1] == pytest.approx(best.value, abs=1e-5) and curve[0] == pytest.approx(trials[0].value, abs=1e-5)
    assert data["search"]["wall_s"] >= data["search"]["calibration_s"] > 0
    assert data["search"]["trials"] == 5 and len(data["search"]["calibration_ids"]) == 2
    assert set(data["search"]["known_masks"]) == {"[1, 3]", "[3, 4]"}

    path.unlink()  # a complete study still exports, from the study alone (nothing is calibrated again)
    again = run_study(dimr_cfg(5))
    assert again["finished_trials"] == 5 and load_mask(str(path), LAYERS) == tuple(best.user_attrs["skip"])
    assert json.loads(path.read_text())["search"]["calibration_ids"] == data["search"]["calibration_ids"]


def test_bool_encoding_prunes_masks_outside_the_skip_ratio_range(dimr_cfg, tmp_path):
    cfg = dimr_cfg(12, "objective.encoding=bool", "objective.objective=kl+ratio", "objective.min_skip=0.3",
                   "objective.max_skip=0.5", "objective.ratio_weight=0.5")
    run_study(cfg)
    trials = load(cfg).trials
    done = [t for t in trials if t.state == TrialState.COMPLETE]
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    assert len(done) + len(pruned) == 12 and done and pruned  # random booleans hit both sides
    assert all(t.user_attrs["num_skipped"] in (2, 3) for t in done)  # 2/6 and 3/6 lie in [0.3, 0.5]
    assert all(t.user_attrs["num_skipped"] not in (2, 3) and t.user_attrs["infeasible"] for t in pruned)
    assert all(t.value == pytest.approx(t.user_attrs["kl"] + 0.5 * (1 - t.user_attrs["num_skipped"] / 6))
               for t in done)
    skip = load_mask(str(tmp_path / "masks" / "tiny6-dimr.json"), LAYERS)
    assert len(skip) in (2, 3) and 0 not in skip and LAYERS - 1 not in skip
    assert skip == tuple(min(done, key=lambda t: t.value).user_attrs["skip"])


def test_pareto_study_has_two_directions_and_exports_the_best_kl_front_mask_reaching_the_target(dimr_cfg, tmp_path):
    cfg = dimr_cfg(10, "objective.encoding=bool", "objective.objective=pareto", "objective.min_skip=0.15",
                   "objective.max_skip=0.5")
    summary = run_study(cfg)
    study = load(cfg)
    assert [d.name for d in study.directions] == ["MINIMIZE", "MAXIMIZE"] and summary["best"]
    done = [t for t in study.trials if t.state == TrialState.COMPLETE]
    assert all(t.values == [t.user_attrs["kl"], t.user_attrs["num_skipped"] / 6] for t in done)
    reaching = [t for t in study.best_trials if t.user_attrs["num_skipped"] >= 2]  # the known masks skip 2
    expected = min(reaching, key=lambda t: t.values[0])
    data = json.loads((tmp_path / "masks" / "tiny6-dimr.json").read_text())
    assert load_mask(str(tmp_path / "masks" / "tiny6-dimr.json"), LAYERS) == tuple(expected.user_attrs["skip"])
    assert data["search"]["trial"] == expected.number and data["search"]["objective"] == "pareto"


@pytest.mark.parametrize("overrides, expected", [
    (["objective.skip=5"], "objective.skip=5: model tiny6 has only 4 inner layers to skip"),
    (["objective.encoding=bool", "objective.max_skip=0.3"],  # 2 of 6 layers = 0.333: known masks would be pruned
     "objective.skip=2 (2/6 = 0.333 of model tiny6's layers) is outside [objective.min_skip, objective.max_skip]"),
    (["objective.known_masks=[[1,2,3]]"], "objective.known_masks: [1, 2, 3] skips 3 layers, encoding=topk needs"),
    (["objective.known_masks=[[0,5]]"], "objective.known_masks: [0, 5] must list inner layers of 1..4"),
    (["objective.objective=between", "objective.drafter_exit_layer=6"],
     "objective.drafter_exit_layer=6: model tiny6 has 6 layers"),
    (["objective.objective=between", "objective.drafter_exit_layer=2", "objective.drafter_head=/no/such/head"],
     "objective.drafter_head=/no/such/head: no exit-head checkpoint there"),
])
def test_settings_that_do_not_fit_the_model_stop_with_one_line(dimr_cfg, overrides, expected):
    with pytest.raises(ConfigError) as err:
        run_study(dimr_cfg(2, *overrides))
    assert str(err.value).startswith(expected) and "\n" not in str(err.value)


def test_the_shipped_smollm2_mask_still_loads():
    assert load_mask("smollm2-135m-dimr", 30) == (5, 10, 14, 15, 17, 26)


def test_mask_file_round_trip_and_layer_count_check(tmp_path):
    path = tmp_path / "m.json"
    save_mask(path, [5, 2], num_layers=8, model="x")
    assert load_mask(str(path), 8) == (2, 5)
    with pytest.raises(ConfigError, match="8-layer"):
        load_mask(str(path), 30)
    path.write_text("{not json")
    with pytest.raises(ConfigError, match="malformed"):
        load_mask(str(path), 8)


@pytest.mark.parametrize("overrides, expected", [
    (["objective.encoding=foo"], "objective.encoding='foo' is not allowed; choose one of: topk, bool"),
    (["objective.objective=pareto"], "objective.objective=pareto needs objective.encoding=bool"),
    (["objective.encoding=bool", "objective.min_skip=0.5", "objective.max_skip=0.2"],
     "objective.max_skip=0.2 is out of range [0.5, 1.0]"),
    (["objective.known_masks=[odd]"], "objective.known_masks: 'odd' is not allowed"),
])
def test_bad_dimr_options_give_one_line(overrides, expected):
    message = first_config_problem(["objective=dimr", *overrides], config_name="search")
    assert message is not None and message.startswith(expected) and "\n" not in message


def test_between_cost_is_the_two_hop_kl_through_the_slim_model(six_layer_dir):
    """objective=between: KL(p || q_z) + KL(q_z || q), p = the early exit (here after layer 0),
    checked against log-probs computed directly; with nothing skipped it is KL(p || q)."""
    from transformers import AutoModelForCausalLM

    from decoding.engine.target import TargetModel

    model = AutoModelForCausalLM.from_pretrained(six_layer_dir, dtype=torch.float32).eval()
    target = TargetModel(model)
    seqs = [[10, 11, 12, 13, 14, 15, 16, 17], [20, 21, 22, 23, 24]]
    n = sum(map(len, seqs))
    plain, between = MaskCost(target, seqs), MaskCost(target, seqs, TargetModel(model, layers=(0,)))

    def logprobs(layers):
        return [MaskCost._logprobs(TargetModel(model, layers=layers), s) for s in seqs]

    def kl(a, b):
        return sum(float((x.exp() * (x - y)).sum()) for x, y in zip(a, b)) / n

    full, early = logprobs(tuple(range(LAYERS))), logprobs((0,))
    assert between(()) == pytest.approx(kl(early, full), rel=1e-4)
    skip = (2, 3)
    slim = logprobs((0, 1, 4, 5))
    assert between(skip) == pytest.approx(kl(early, slim) + kl(slim, full), rel=1e-4)
    assert plain(skip) == pytest.approx(kl(full, slim), rel=1e-4)


def test_study_settings_keep_only_what_the_cost_depends_on(tmp_path, monkeypatch):
    """A resumed DIMR study is compared on these fields (search/study.py): fields the chosen cost
    ignores may change, and two spellings of one exit-head folder are the same setting."""
    from search.dimr import DIMRObjectiveConfig, settings

    plain = settings(DIMRObjectiveConfig(objective="kl", drafter_head="anything", ratio_weight=3.0, min_skip=0.2))
    assert plain == settings(DIMRObjectiveConfig(objective="kl"))
    assert "drafter_head" not in plain and "min_skip" not in plain and plain["skip"] == 6
    (tmp_path / "head").mkdir()
    monkeypatch.chdir(tmp_path)
    relative = settings(DIMRObjectiveConfig(objective="between", drafter_head="head"))
    assert relative == settings(DIMRObjectiveConfig(objective="between", drafter_head=str(tmp_path / "head")))
    assert relative != settings(DIMRObjectiveConfig(objective="between", drafter_exit_layer=5, drafter_head="head"))


def test_calibration_answers_end_at_the_stop_token_as_decoding_does(six_layer_dir):
    """Before 2026-12-05 the calibration continued past the end-of-turn token, over text decoding never
    produces; `calibration_stop_at_eos=false` keeps that calibration (old studies resume with it), and the
    option is part of the study settings."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from decoding.engine.target import TargetModel
    from search.dimr import DIMRObjectiveConfig, calibration_sequences, settings

    model = AutoModelForCausalLM.from_pretrained(six_layer_dir, dtype=torch.float32).eval()
    target, tokenizer = TargetModel(model), AutoTokenizer.from_pretrained(six_layer_dir)
    free, _, lengths = calibration_sequences(target, tokenizer, 2, 12)
    answer = free[0][lengths[0]:]
    assert len(answer) == 12
    stop = answer[5]
    end = answer.index(stop)  # the first occurrence ends the answer; its own row would predict past the turn
    stopped, _, _ = calibration_sequences(target, tokenizer, 2, 12, stop_ids=frozenset({stop}))
    assert stopped[0] == free[0][:lengths[0] + end]
    assert settings(DIMRObjectiveConfig())["calibration_stop_at_eos"] is True
    assert "calibration_stop_at_eos" not in settings(DIMRObjectiveConfig(calibration_stop_at_eos=False))


def test_a_study_calibrated_past_the_stop_token_resumes_only_with_the_old_calibration(dimr_cfg):
    """A study saved before `calibration_stop_at_eos` has no such key: resuming it with the new calibration
    would mix two costs, so it is refused with the option that resumes it, which then does."""
    old = run_study(dimr_cfg(2, "objective.calibration_stop_at_eos=false"))
    assert old["finished_trials"] == 2
    with pytest.raises(ConfigError, match=r"other settings \(objective.calibration_stop_at_eos\).*"
                                          r"resumes with objective.calibration_stop_at_eos=false"):
        run_study(dimr_cfg(3))
    assert run_study(dimr_cfg(3, "objective.calibration_stop_at_eos=false"))["finished_trials"] == 3

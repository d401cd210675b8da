"""The search framework (search/study.py) with the PTD objective on a tiny model: trials run and
are recorded in a journal file, a killed worker resumes (its stale trial is failed and the study
continues, nothing finished is re-run), and the best parameters become a method option that the
pipeline composes by name."""

import optuna
import pytest
import yaml
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from pipeline.cli import first_config_problem
from pipeline.errors import ConfigError
from search.study import register_configs, run_study, suggest

register_configs()


def compose_search(overrides):
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="conf", version_base="1.3"):
        cfg = compose("search", overrides=overrides)
    return OmegaConf.to_object(cfg)


@pytest.fixture
def study_cfg(tiny_model_dirs, tmp_path):
    def make(n_trials, metric="tau_per_cost", *extra):
        return compose_search([
            "model.name=tiny", f"model.path={tiny_model_dirs['llama']}", "model.source=hub", "model.dtype=float32", "tracker=none",
            f"n_trials={n_trials}", "sampler=random", f"storage={tmp_path / 'ptd.journal'}", "study_name=t",
            "show_progress=false", "objective.calibration_prompts=2", "objective.max_new_tokens=10",
            f"objective.metric={metric}", f"objective.export_dir={tmp_path / 'conf'}", "objective.export_name=ptd_t",
            "objective.params.depth.high=4", "objective.params.drafting_budget.high=12",
            "objective.params.verification_budget.high=8",
            "objective.enqueue=[{width:2,depth:3,num_seeds:2,seed_mode:context,pool_size:4,verification_budget:6,"
            "drafting_budget:8,context_subtrees:true,recycle:true,graft:true,candidate_depth:4}]", *extra,
        ])
    return make


def test_study_runs_resumes_after_a_kill_and_exports_a_loadable_method(study_cfg, tmp_path, monkeypatch):
    from search import ptd

    first = run_study(study_cfg(2))
    assert first["finished_trials"] == 2 and first["best"]
    study = optuna.load_study(study_name="t", storage=optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(tmp_path / "ptd.journal"))))
    done = {t.number: t.params for t in study.trials}
    assert study.trials[0].params == {"width": 2, "depth": 3, "num_seeds": 2, "seed_mode": "context",
                                      "pool_size": 4, "verification_budget": 6, "drafting_budget": 8,
                                      "context_subtrees": True, "recycle": True, "graft": True,
                                      "candidate_depth": 4}  # enqueued
    assert {"tau", "rows_per_step", "tau_per_cost", "match_rate"} <= set(study.trials[0].user_attrs)
    assert all(t.user_attrs.get("match_rate", 1.0) == 1.0 for t in study.trials)  # greedy PTD == AR
    curve = study.user_attrs[ptd.COST_CURVE_KEY]  # tau_per_cost: one cost curve for the whole study
    assert curve["worker"] == 0 and set(curve["ms"]) >= {"1", "32"}
    killed = study.ask()  # a worker dies mid-trial: the trial stays RUNNING in the journal
    killed.set_user_attr("worker", 0)

    def no_second_curve(*_):
        raise AssertionError("a resumed study measured the cost curve again")

    monkeypatch.setattr(ptd, "forward_cost_curve", no_second_curve)

    resumed = run_study(study_cfg(3))
    assert resumed["recovered_stale_trials"] == 1 and resumed["finished_trials"] == 3
    study = optuna.load_study(study_name="t", storage=optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(tmp_path / "ptd.journal"))))
    assert {n: study.trials[n].params for n in done} == done  # finished trials were not re-run
    assert study.trials[killed.number].state == optuna.trial.TrialState.FAIL
    assert run_study(study_cfg(3))["finished_trials"] == 3  # complete: nothing more runs
    # a second worker joins: it scores with worker 0's stored curve (measuring again would raise above)
    joined = run_study(study_cfg(4, "tau_per_cost", "worker=1", "shared_wait_s=0"))
    assert joined["finished_trials"] == 4
    study = optuna.load_study(study_name="t", storage=optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(tmp_path / "ptd.journal"))))
    joined_trials = [t for t in study.trials if t.user_attrs.get("worker") == 1]
    assert joined_trials and all("tau_per_cost" in t.user_attrs for t in joined_trials
                                 if t.state == optuna.trial.TrialState.COMPLETE)
    # resuming with another cost (here: a different calibration set) would mix two costs in one study
    with pytest.raises(ConfigError, match=r"study 't' exists with other settings \(objective.calibration_prompts\)"):
        run_study(study_cfg(4, "tau_per_cost", "objective.calibration_prompts=3"))

    exported = tmp_path / "conf" / "method" / "ptd_t.yaml"
    values = yaml.safe_load(exported.read_text())
    assert values["defaults"] == ["ptd_schema", "_self_"] and values["name"] == "ptd_t"
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="conf", version_base="1.3"):
        cfg = compose("config", overrides=["method=ptd_t", f"hydra.searchpath=[file://{tmp_path / 'conf'}]"])
    method = OmegaConf.to_object(cfg).method
    best = joined["best"][0]["params"]
    assert method._target_ == "decoding.methods.ptd.PTD" and all(getattr(method, k) == v for k, v in best.items())


def test_suggest_reads_int_float_and_categorical_specs():
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    trial = study.ask()
    values = suggest(trial, {"a": {"type": "int", "low": 1, "high": 3}, "b": {"type": "float", "low": 0.1, "high": 1,
                                                                               "log": True},
                             "c": {"type": "categorical", "choices": ["x", "y"]}})
    assert 1 <= values["a"] <= 3 and 0.1 <= values["b"] <= 1 and values["c"] in ("x", "y")


def test_the_gp_sampler_fits_no_noise_to_objectives_that_repeat_exactly():
    from search import dimr, ptd
    from search.study import make_sampler

    assert dimr.deterministic(dimr.DIMRObjectiveConfig())
    assert ptd.deterministic(ptd.PTDObjectiveConfig(metric="tau"))
    assert ptd.deterministic(ptd.PTDObjectiveConfig(metric="tau_per_cost"))  # one stored cost curve per study
    assert not ptd.deterministic(ptd.PTDObjectiveConfig(metric="speedup"))  # a timed ratio
    assert make_sampler("gp", 0, deterministic=True)._deterministic
    assert not make_sampler("gp", 0)._deterministic


@pytest.mark.parametrize("override, expected", [
    ("sampler=cmaes", "sampler='cmaes' is not allowed; choose one of: tpe, random, gp"),
    ("objective.metric=bleu", "objective.metric='bleu' is not allowed; choose one of: speedup, tau_per_cost, tau"),
    ("objective=nope", "objective=nope is not an option; choose one of: dimr, ptd"),
])
def test_bad_search_options_give_one_line(override, expected):
    message = first_config_problem([override], config_name="search")
    assert message is not None and message.startswith(expected) and "\n" not in message


def test_a_trial_that_raises_stops_the_worker_with_one_line_and_keeps_finished_trials(study_cfg, tmp_path,
                                                                                        monkeypatch):
    """The T>0-on-CUDA crash used to be caught (catch=RuntimeError) and every trial silently
    recorded as failed; now the first such trial stops the search with one line."""
    import search.ptd
    from search.study import TrialFailed

    real = search.ptd.objective
    calls = []

    def crashes_on_the_second_trial(trial, ctx):
        calls.append(trial.number)
        if len(calls) == 2:
            raise RuntimeError("Expected a 'cuda' device type for generator but found 'cpu'\nmore detail")
        return real(trial, ctx)

    monkeypatch.setattr(search.ptd, "objective", crashes_on_the_second_trial)
    with pytest.raises(TrialFailed) as info:
        run_study(study_cfg(3))
    message = str(info.value)
    assert message == ("trial 1 of study 't' failed (RuntimeError: Expected a 'cuda' device type for generator but "
                       "found 'cpu'); the study keeps its 1 finished trials and resumes from them")
    study = optuna.load_study(study_name="t", storage=optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(tmp_path / "ptd.journal"))))
    states = [t.state for t in study.trials]
    assert states == [optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL]
    assert len(calls) == 2  # no third trial ran after the failure


def test_a_resumed_study_proposes_new_trials_and_refuses_another_dtype(study_cfg, tmp_path):
    """A sampler seeded as at the first start re-proposed the first run's trials after every kill or
    requeue; and a study resumed under another dtype (model.dtype=auto differs by machine) mixed scales."""
    first = run_study(study_cfg(2, "tau", "objective.enqueue=[]"))
    assert first["finished_trials"] == 2
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(tmp_path / "ptd.journal")))
    before = [t.params for t in optuna.load_study(study_name="t", storage=storage).trials]
    run_study(study_cfg(4, "tau", "objective.enqueue=[]"))
    after = [t.params for t in optuna.load_study(study_name="t", storage=storage).trials]
    assert after[:2] == before and all(p not in before for p in after[2:])
    with pytest.raises(ConfigError, match=r"exists with other settings \(model.dtype\)"):
        run_study(study_cfg(5, "tau", "objective.enqueue=[]", "model.dtype=bfloat16"))


def test_a_bad_fixed_value_is_one_line_before_any_trial(study_cfg):
    with pytest.raises(ConfigError, match=r"objective.fixed.depth=0: method.depth"):
        run_study(study_cfg(2, "tau", "+objective.fixed.depth=0"))


def test_a_non_finite_value_stops_the_worker(study_cfg, monkeypatch):
    """Optuna records a NaN value as FAIL and carries on: the search would skip such trials unseen."""
    import search.ptd
    from search.study import TrialFailed

    monkeypatch.setattr(search.ptd, "objective", lambda trial, ctx: float("nan"))
    with pytest.raises(TrialFailed, match=r"trial 0 of study 't' failed \(ValueError: the objective returned nan"):
        run_study(study_cfg(2, "tau"))


def test_a_study_saved_before_the_model_settings_resumes_and_records_them(study_cfg, tmp_path):
    """Model settings recorded since 2026-12-05 are not held against an older study (then recorded); any
    other setting one side lacks still refuses (DIMR's prefill calibration records no calibration key)."""
    from search.study import MODEL_SETTINGS_SINCE_2026_12_05

    run_study(study_cfg(1, "tau", "objective.enqueue=[]"))
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(tmp_path / "ptd.journal")))
    study = optuna.load_study(study_name="t", storage=storage)
    current = study.user_attrs["settings"]
    older = {k: v for k, v in current.items() if k not in MODEL_SETTINGS_SINCE_2026_12_05}
    study.set_user_attr("settings", older)
    assert run_study(study_cfg(2, "tau", "objective.enqueue=[]"))["finished_trials"] == 2
    assert optuna.load_study(study_name="t", storage=storage).user_attrs["settings"] == current
    study.set_user_attr("settings", {**current, "objective.calibration": "decode"})
    with pytest.raises(ConfigError, match=r"other settings \(objective.calibration\)"):
        run_study(study_cfg(3, "tau", "objective.enqueue=[]"))


def test_fixed_values_are_checked_alone_and_together_where_no_rule_field_is_searched():
    from types import SimpleNamespace

    from search.ptd import check_fixed

    searched = {"drafting_budget": {"type": "int", "low": 12, "high": 64}}
    check_fixed(SimpleNamespace(fixed={"num_seeds": 10}, params=searched))  # the trials' budgets decide
    check_fixed(SimpleNamespace(fixed={"num_seeds": 10, "drafting_budget": 16}, params={}))
    with pytest.raises(ConfigError, match=r"objective.fixed=\{'num_seeds': 10, 'drafting_budget': 5\}"):
        check_fixed(SimpleNamespace(fixed={"num_seeds": 10, "drafting_budget": 5}, params={}))
    with pytest.raises(ConfigError, match=r"objective.fixed.widht=2"):
        check_fixed(SimpleNamespace(fixed={"widht": 2}, params={}))


def test_a_shared_measurement_is_measured_by_worker_0_and_waited_for_by_the_others():
    import threading

    from pipeline.errors import ConfigError
    from search.study import shared_measurement

    study = optuna.create_study()
    calls = []

    def measure(value):
        def run():
            calls.append(value)
            return {"v": value}
        return run

    # worker 1 starts first and waits; worker 0 measures and stores it a moment later
    stored_late = threading.Timer(0.3, lambda: shared_measurement(study, "m", 0, measure("w0"), wait_s=0))
    stored_late.start()
    assert shared_measurement(study, "m", 1, measure("w1"), wait_s=30, poll_s=0.05) == {"v": "w0"}
    stored_late.join()
    assert calls == ["w0"]
    # a resume (any worker) reads the stored value
    assert shared_measurement(study, "m", 0, measure("again"), wait_s=0) == {"v": "w0"} and calls == ["w0"]
    # worker 0 never comes: another worker never measures it (two could store different values); one line
    other = optuna.create_study()
    with pytest.raises(ConfigError, match=r"worker 2: study .* has no m yet, which worker 0 measures; waited "
                                          r"shared_wait_s=0.1 s. Start worker 0, or raise shared_wait_s"):
        shared_measurement(other, "m", 2, measure("w2"), wait_s=0.1, poll_s=0.05)
    assert "m" not in other.user_attrs and calls == ["w0"]

"""Shipped files load from the package; what a search exports goes to the user's folder and loads by
name from there, ahead of the shipped option of the same name, without touching tracked files."""

from types import SimpleNamespace

import pytest
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

import pipeline
from decoding.drafting.routing import load_mask, save_mask
from pipeline.resources import ASSETS, SHIPPED_MASKS, user_conf, user_dir, user_masks
from pipeline.schema import register_configs


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def compose_method(name: str):
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="conf", version_base="1.3"):
        return OmegaConf.to_object(compose("config", overrides=[f"method={name}"])).method


def test_assets_are_package_data(tmp_path, monkeypatch):
    assert ASSETS.parent == __import__("pathlib").Path(pipeline.__file__).resolve().parent
    assert (ASSETS / "drafters" / "smollm2-135m" / "dflash" / "config.json").is_file()
    assert (SHIPPED_MASKS / "smollm2-135m-dimr.json").is_file()
    monkeypatch.delenv("SPECDEC_HOME", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert user_dir() == tmp_path / "specdec"


def test_an_exported_mask_loads_by_name_and_wins_over_the_shipped_one(home):
    shipped = load_mask("smollm2-135m-dimr", 30)
    save_mask(user_masks() / "smollm2-135m-dimr.json", [1, 2], num_layers=30, model="smollm2-135m")
    save_mask(user_masks() / "mine.json", [3], num_layers=30, model="smollm2-135m")
    assert load_mask("smollm2-135m-dimr", 30) == (1, 2) != shipped and load_mask("mine", 30) == (3,)
    assert load_mask(str(SHIPPED_MASKS / "smollm2-135m-dimr.json"), 30) == shipped  # the shipped file is untouched


def test_a_ptd_search_exports_to_the_user_folder_and_method_loads_it_by_name(home):
    from search.ptd import PTDObjectiveConfig, export

    obj = PTDObjectiveConfig(export_name="ptd_tuned")
    cfg = SimpleNamespace(objective=obj, study_name="s", sampler="tpe", model=SimpleNamespace(name="m"))
    trial = SimpleNamespace(params={"num_seeds": 3, "depth": 5}, user_attrs={"tau": 2.0}, values=[1.5], number=7)
    path = export(trial, None, cfg)
    assert path == user_conf() / "method" / "ptd_tuned.yaml"
    tuned = compose_method("ptd_tuned")  # the user's export shadows conf/method/ptd_tuned.yaml
    assert (tuned.num_seeds, tuned.depth) == (3, 5)
    path.unlink()
    assert (compose_method("ptd_tuned").num_seeds, compose_method("ptd_tuned").depth) != (3, 5)

"""Every config option composes and validates; bad values give one clear line."""

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from pipeline.cli import first_config_problem
from pipeline.schema import RunConfig, register_configs

register_configs()

MODELS = ["smollm2-135m", "qwen3-0.6b", "qwen3-4b", "qwen3-8b", "llama-2-7b-chat", "llama-3-8b-instruct",
          "codellama-7b-instruct", "qwen2-7b-instruct", "gemma3-270m", "gemma3-4b-it", "gemma3-12b-it",
          "gemma3-27b-it"]
TASKS = ["mt_bench", "gsm8k", "humaneval", "mbpp", "cnn_dm", "wmt_de_en", "qa", "alpaca", "math500", "spec_bench"]


def compose_run(overrides):
    with initialize_config_module(config_module="conf", version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    return OmegaConf.to_object(cfg)


def test_default_config_compares_ar_pld_ptd_offline_on_smollm2_humaneval():
    rc = compose_run([])
    assert isinstance(rc, RunConfig)
    assert (rc.model.name, rc.task.name, rc.method, rc.methods, rc.tracker.kind) == \
        ("smollm2-135m", "humaneval", None, ["ar", "pld", "ptd"], "wandb")
    assert rc.model.source == "gguf_wheel" and rc.tracker.mode == "offline"
    assert compose_run(["method=ptd"]).method.name == "ptd"  # one method alone


def test_no_method_and_no_methods_is_one_line():
    assert first_config_problem(["methods=[]"]) == \
        "no method: give method=<name> (one method against AR) or methods=[ar,pld,...]"


@pytest.mark.parametrize("model", MODELS)
def test_every_model_composes(model):
    rc = compose_run([f"model={model}"])
    assert rc.model.name == model and rc.model.path


@pytest.mark.parametrize("task", TASKS)
def test_every_task_composes(task):
    assert compose_run([f"task={task}"]).task.name == task


@pytest.mark.parametrize("override, expected", [
    ("method=foo", "method=foo is not an option; choose one of: "),
    ("task=nope", "task=nope is not an option; choose one of: alpaca, cnn_dm"),
    ("model.foo=1", "unknown config key 'model.foo'"),
    ("task.limit=abc", "task.limit='abc' is not a valid Integer"),
    ("temperature=-1", "temperature=-1.0 is out of range"),
    ("model.dtype=int8", "model.dtype='int8' is not allowed; choose one of: float32, bfloat16, float16, auto"),
    ("tracker.kind=mlflow", "tracker.kind='mlflow' is not allowed; choose one of: wandb, none"),
    ("task.sandbox=docker", "task.sandbox='docker' is not allowed; choose one of: auto, bwrap, unshare, unsafe"),
])
def test_bad_overrides_give_one_clear_line(override, expected):
    message = first_config_problem([override])
    assert message is not None and message.startswith(expected) and "\n" not in message


def test_sweep_overrides_are_checked_per_combination():
    assert first_config_problem(["task=gsm8k,humaneval", "temperature=0,0.5"]) is None
    assert first_config_problem(["task=gsm8k,bogus"]).startswith("task=bogus is not an option")


def test_console_scripts_point_at_the_entry_points():
    import subprocess
    import sys
    from importlib.metadata import entry_points

    scripts = {e.name: e for e in entry_points(group="console_scripts") if e.name.startswith("specdec")}
    assert set(scripts) == {"specdec", "specdec-search", "specdec-report", "specdec-train"}
    assert all(callable(e.load()) for e in scripts.values())
    proc = subprocess.run([sys.executable, "-c", "import sys; from pipeline.__main__ import cli; sys.argv = ['specdec', "
                           "'method=nope']; cli()"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().startswith("error: method=nope is not an option")

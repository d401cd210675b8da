"""pipeline/environment.py: a transformers older than the engine needs is named in one line, by the commands too."""

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from pipeline import environment

PROJECT_ROOT = Path(__file__).resolve().parents[2]
LINE = "transformers 5.0.0 is installed; this project needs transformers>=5.15: pip install -U 'transformers>=5.15'"


@pytest.mark.parametrize("installed, too_old", [("5.0.0", True), ("5.14.1", True), ("4.57.6", True),
                                                ("5.15.0", False), ("5.25.0", False), ("5.26.0.dev0", False),
                                                ("5.20.0+local", False), ("a-custom-build", False)])
def test_a_transformers_older_than_the_engine_needs_is_named(installed, too_old, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", types.SimpleNamespace(__version__=installed))
    problem = environment.old_libraries()
    assert (problem is not None) == too_old
    if too_old:
        assert f"transformers {installed} is installed" in problem and "transformers>=5.15" in problem


def test_every_command_stops_with_one_line_where_an_old_transformers_is_installed(tmp_path):
    """A package named transformers, version 5.0.0, first on the path: what `import transformers` loads."""
    (tmp_path / "transformers").mkdir()
    (tmp_path / "transformers" / "__init__.py").write_text('__version__ = "5.0.0"\n')
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{PROJECT_ROOT}"}
    commands = [["-m", "pipeline", "method=ar"], ["-m", "pipeline.train"], ["-m", "search"],
                ["-m", "pipeline.report", str(tmp_path)]]
    for command in commands:
        proc = subprocess.run([sys.executable, *command], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=300)
        assert (proc.returncode, proc.stderr.strip().splitlines()) == (2, [f"error: {LINE}"]), command
    # a library import: the same line, raised
    proc = subprocess.run([sys.executable, "-c", "import decoding.engine.target"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1] == f"ImportError: {LINE}"

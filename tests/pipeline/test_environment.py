"""pipeline/environment.py: a transformers older than the engine needs is named in one line, by the CLIs too."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline import environment

PROJECT_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("installed, too_old", [("5.0.0", True), ("5.14.1", True), ("4.57.6", True),
                                                ("5.15.0", False), ("5.25.0", False), ("5.26.0.dev0", False)])
def test_a_transformers_older_than_the_engine_needs_is_named(installed, too_old, monkeypatch):
    monkeypatch.setattr(environment, "version", lambda name: installed)
    problem = environment.old_libraries()
    assert (problem is not None) == too_old
    if too_old:
        assert f"transformers {installed} is installed" in problem and "transformers>=5.15" in problem


def test_the_cli_stops_with_one_line_where_an_old_transformers_is_installed(tmp_path):
    """The metadata of transformers 5.0.0 first on the path (the package itself stays the installed one)."""
    info = tmp_path / "transformers-5.0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: transformers\nVersion: 5.0.0\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{PROJECT_ROOT}"}
    for module in ("pipeline", "pipeline.train"):
        proc = subprocess.run([sys.executable, "-m", module, "method=ar"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2
        assert proc.stderr.strip().splitlines() == [
            "error: transformers 5.0.0 is installed; this project needs transformers>=5.15: "
            "pip install -U 'transformers>=5.15'"]
    with pytest.raises(subprocess.CalledProcessError) as raised:  # a library import: the same line, raised
        subprocess.run([sys.executable, "-c", "import decoding.engine.target"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300, check=True)
    assert raised.value.stderr.strip().splitlines()[-1].startswith("ImportError: transformers 5.0.0 is installed")

"""`--help` lists every model, method and task with one line each (and the search's objectives)."""

import subprocess
import sys

import pytest

from pipeline.help import CONF


@pytest.mark.parametrize("app, groups", [("pipeline", ("method", "model", "task", "drafter", "experiment")),
                                         ("search", ("objective", "model"))])
def test_help_lists_every_option_of_the_groups_with_a_description(app, groups):
    proc = subprocess.run([sys.executable, "-m", app, "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stderr == ""
    lines = proc.stdout.splitlines()
    for group in groups:
        for option in sorted(p.stem for p in (CONF / group).glob("*.yaml")):
            row = next((line for line in lines if line.split()[:1] == [option]), None)
            assert row is not None and len(row.split()) > 1, (group, option)  # named, with a description
    assert "_schema" not in proc.stdout and "hydra/launcher" not in proc.stdout.split("usage")[0]
    assert "Powered by Hydra" not in proc.stdout  # our page, not Hydra's generic one

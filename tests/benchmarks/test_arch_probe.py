"""benchmarks/arch_probe.py: a line per model family, the failures named, exit 1 on one."""

import os
import subprocess
import sys
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def run(*args, plant: Path | None = None):
    """The script on this checkout (PYTHONPATH: not an installed copy of the project), with `plant` a folder whose
    sitecustomize.py runs first."""
    path = [str(plant)] if plant else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*path, str(PROJECT_ROOT)])}
    return subprocess.run([sys.executable, "benchmarks/arch_probe.py", *args], cwd=PROJECT_ROOT, capture_output=True,
                          text=True, timeout=600, env=env)


def test_the_probe_passes_a_scaled_family_names_what_it_ran_and_reports_a_refusal():
    proc = run("--archs", "granite,phi3,llama4", "--methods", "ar,ptd,sd_slim,via_sd", "--tokens", "12")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    granite = next(ln for ln in lines if ln.startswith("granite"))
    assert "subset path 0.0e+00" in granite and "2/2 lossless = AR, 6/6 runs" in granite
    llama4 = next(ln for ln in lines if ln.startswith("llama4"))
    assert "refused: llama4_text: layer type(s) chunked_attention are not supported" in llama4
    assert lines[-3:] == ["no failures", "refused with one line: llama4",
                          "families probed: 3, every check passed: granite, phi3"]


def test_the_static_forward_probe_replays_each_lossless_method_to_ar_and_runs_on_the_meta_device():
    proc = run("--archs", "gemma3,mixtral", "--methods", "ar,ddtree", "--tokens", "8", "--static")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    for arch in ("gemma3", "mixtral"):
        line = next(ln for ln in proc.stdout.splitlines() if ln.startswith(arch))
        assert line.endswith("1/1 lossless = AR, 2/2 runs; static 2/2 = AR, meta ok"), line


def test_a_failing_family_is_named_and_the_exit_code_says_so(tmp_path):
    """A family whose readout the layer-subset path does not know (the Readout check planted to refuse) fails."""
    plant = tmp_path / "sitecustomize.py"
    plant.write_text("from decoding.engine import readout\n"
                     "def refuse(self, model, **kwargs):\n"
                     "    raise readout.UnsupportedArchitecture(f'{model.config.model_type}: planted')\n"
                     "readout.Readout.check = refuse\n")
    proc = run("--archs", "cohere", "--methods", "ar,sd_slim", "--tokens", "8", plant=tmp_path)
    assert proc.returncode == 1
    assert "  cohere: readout: cohere: planted" in proc.stdout
    assert "  cohere: sd_slim T=0: UnsupportedArchitecture: cohere: planted" in proc.stdout
    assert proc.stdout.splitlines()[-1] == "families probed: 1, every check passed: none"

"""Run generated code (plus its tests) in a separate, resource-limited Python process.

Generated code is never executed in this process. Isolation is best-effort only, with no
namespaces or seccomp: a fresh temp dir as cwd, `python -I` (no user site, no PYTHON* env), a
minimal environment whose proxies point at a dead port, rlimits (address space, CPU, file size, no
core dumps), stdin closed, its own session so the whole process group is killed on timeout, and a
boot prelude that makes sockets raise OSError and turns the destructive os/shutil/subprocess calls
into errors. RLIMIT_NPROC is not set: it counts every process of the user (root in containers),
so a low value would break unrelated work. Code that deliberately works around the prelude (e.g.
via ctypes) is not contained; run untrusted models only on disposable machines.
"""

from __future__ import annotations

import math
import os
import resource
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

DEFAULT_TIMEOUT_S = 10.0
MEMORY_LIMIT_BYTES = 1 << 30
FILE_SIZE_LIMIT_BYTES = 10 << 20
PROGRAM_FILE = "program.py"
BOOT_FILE = "sandbox_boot.py"

# Runs before the program in the child. run_name is not "__main__" so a model's own
# `if __name__ == "__main__":` demo (often reading stdin or calling sys.exit) does not run, as in
# the official HumanEval harness; an explicit exit before the tests end counts as an error.
BOOT = f"""\
import _socket, os, runpy, shutil, socket, subprocess, sys

class _NoNetwork(socket.socket):  # a subclass, so modules that subclass socket (ssl) still import
    def __init__(self, *args, **kwargs):
        raise OSError("network access is disabled in the sandbox")

def _no_network(*args, **kwargs):
    raise OSError("network access is disabled in the sandbox")

def _disabled(*args, **kwargs):
    raise PermissionError("disabled in the sandbox")

socket.socket = _socket.socket = _NoNetwork
socket.create_connection = socket.getaddrinfo = socket.socketpair = socket.fromfd = _no_network
for _name in ("system", "kill", "killpg", "fork", "forkpty", "remove", "unlink", "rmdir", "removedirs",
              "rename", "renames", "replace", "truncate", "chmod", "chown", "chroot", "setuid",
              "execv", "execve", "posix_spawn", "posix_spawnp"):
    if hasattr(os, _name):
        setattr(os, _name, _disabled)
shutil.rmtree = shutil.move = shutil.chown = _disabled
subprocess.Popen = _disabled
try:
    runpy.run_path({PROGRAM_FILE!r}, run_name="__sandbox__")
except SystemExit as e:
    sys.stderr.write(f"SystemExit: the program exited ({{e.code!r}}) before its tests finished\\n")
    raise SystemExit(3)
"""


@dataclass(frozen=True)
class SandboxResult:
    passed: bool
    reason: str  # "passed" | "failed" (an assertion failed) | "timeout" | "error" (anything else)
    detail: str = ""  # last stderr line, for logs


def _limits(timeout_s: float):
    cpu_s = math.ceil(timeout_s) + 1  # backstop for the wall-clock timeout; SIGXCPU ends the process

    def apply() -> None:  # runs in the child between fork and exec
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
        resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE_LIMIT_BYTES, FILE_SIZE_LIMIT_BYTES))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def _env(workdir: str) -> dict[str, str]:
    dead_proxy = "http://127.0.0.1:9"  # discard port: proxy-aware clients fail fast
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir}
    env.update({"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    for key in ("http_proxy", "https_proxy", "ftp_proxy", "all_proxy"):
        env[key] = env[key.upper()] = dead_proxy
    env["no_proxy"] = env["NO_PROXY"] = ""
    return env


def _last_line(path: Path) -> str:
    with path.open("rb") as fh:
        fh.seek(max(0, path.stat().st_size - 4096))
        lines = fh.read().decode("utf-8", "replace").strip().splitlines()
    return lines[-1][:300] if lines else ""


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # pid == pgid thanks to start_new_session
    except (ProcessLookupError, PermissionError):
        pass


def run_program(source: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> SandboxResult:
    """Execute `source` as a script in the sandbox; passed means it exited 0 within `timeout_s`."""
    with tempfile.TemporaryDirectory(prefix="specdec-sandbox-", ignore_cleanup_errors=True) as workdir:
        work = Path(workdir)
        (work / PROGRAM_FILE).write_text(source, encoding="utf-8")
        (work / BOOT_FILE).write_text(BOOT, encoding="utf-8")
        stderr_path = work / "stderr.txt"
        # output goes to files, not pipes: a chatty program cannot fill our memory or block on a pipe
        with open(work / "stdout.txt", "wb") as out, open(stderr_path, "wb") as err:
            proc = subprocess.Popen(
                [sys.executable, "-I", BOOT_FILE],
                cwd=workdir,
                env=_env(workdir),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
                preexec_fn=_limits(timeout_s),
            )
            try:
                code = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                proc.wait()
                return SandboxResult(False, "timeout", f"no exit within {timeout_s:g} s")
            finally:
                _kill_group(proc)  # also reaps anything the program left running in the background
        detail = _last_line(stderr_path)
    if code == 0:
        return SandboxResult(True, "passed")
    if code == -signal.SIGXCPU:
        return SandboxResult(False, "timeout", "CPU time limit exceeded")
    if detail.startswith("AssertionError"):
        return SandboxResult(False, "failed", detail)
    return SandboxResult(False, "error", detail or f"exit code {code}")

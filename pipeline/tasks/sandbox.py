"""Run generated code (plus its tests) in a separate, isolated, resource-limited Python process.

Generated code is never executed in this process. Isolation (`task.sandbox`), chosen at run time:

- `bwrap` (bubblewrap; `auto` picks it when it can start): the program sees a read-only system
  (/usr, the Python installation, the dynamic loader's cache) and nothing else of the machine (no
  project, no home, no run outputs), its temp folder as the only writable path (the sandbox's root
  is remounted read-only, so a write anywhere else fails, whatever API makes it: `open`, `os.open`,
  `ctypes`), new network (no interface up), PID (no other process is visible or signalable), IPC,
  UTS and user namespaces, all capabilities dropped, killed with its parent, its own session;
- `unsafe`: no OS isolation, only the limits below; named so, and never chosen by `auto`.
  Where bwrap cannot start, `auto` and `bwrap` refuse with one line saying why and how to install it.
  (`unshare`, the issue's second tier, is not built: it is refused with one line too.)

Inside either: a fresh temp dir as cwd, `python -I` (no user site, no PYTHON* env), a minimal
environment whose proxies point at a dead port, rlimits (address space, CPU, file size, no core
dumps), stdin closed, a session of its own so the whole process group is killed on timeout, output
to files, and a boot prelude that makes sockets raise OSError and turns the destructive
os/shutil/subprocess calls into errors (a courtesy for honest programs; the isolation is the OS's).
RLIMIT_NPROC is not set: it counts every process of the user (root in containers), so a low value
would break unrelated work.
"""

from __future__ import annotations

import functools
import math
import os
import shutil as _shutil
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


ISOLATIONS = ("auto", "bwrap", "unshare", "unsafe")
_requested = "auto"  # task.sandbox of this process's job (configure)


class SandboxUnavailable(RuntimeError):
    """The requested isolation cannot run here (one line for the user)."""


def _bwrap_command(workdir: str) -> list[str]:
    """bwrap's arguments: a read-only system, the work dir the only writable path, no network, own PID ns."""
    cmd = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL",
           "--ro-bind", "/usr", "/usr", "--dev", "/dev", "--proc", "/proc"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(top):  # merged-/usr systems: /lib -> usr/lib
            cmd += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            cmd += ["--ro-bind", top, top]
    if os.path.exists("/etc/ld.so.cache"):
        cmd += ["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    for prefix in dict.fromkeys((sys.base_prefix, sys.prefix)):  # the Python installation (pyenv, conda, venv)
        if not prefix.startswith("/usr"):
            cmd += ["--ro-bind", prefix, prefix]
    # the root and /dev (its shm folder) read-only: only the work dir takes writes
    cmd += ["--bind", workdir, workdir, "--chdir", workdir, "--remount-ro", "/dev", "--remount-ro", "/"]
    return cmd


def _python() -> str:
    return os.path.realpath(sys.executable)  # a venv's symlink may live in a folder the sandbox hides


@functools.cache
def _bwrap_problem() -> str | None:
    """Why bwrap cannot run a program here, or None when it can (probed once per process)."""
    if _shutil.which("bwrap") is None:
        return "bwrap is not installed (Debian/Ubuntu: apt install bubblewrap)"
    with tempfile.TemporaryDirectory(prefix="specdec-sandbox-probe-") as workdir:
        try:
            proc = subprocess.run([*_bwrap_command(workdir), _python(), "-I", "-c", "pass"], capture_output=True,
                                  text=True, timeout=30, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as err:
            return f"bwrap did not start ({err})"
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        return f"bwrap cannot start here ({last}; user namespaces may be disabled)"
    return None


def resolve_isolation(requested: str = "auto") -> str:
    """The isolation generated code will run under for `task.sandbox=requested`: bwrap or unsafe."""
    if requested not in ISOLATIONS:
        raise SandboxUnavailable(f"task.sandbox={requested} is not an option; choose one of: {', '.join(ISOLATIONS)}")
    if requested == "unsafe":
        return "unsafe"
    if requested == "unshare":
        raise SandboxUnavailable("task.sandbox=unshare is not built yet; use task.sandbox=bwrap (install bubblewrap) "
                                 "or, on a disposable machine, task.sandbox=unsafe")
    problem = _bwrap_problem()
    if problem is None:
        return "bwrap"
    hint = "install bubblewrap, or opt in to unisolated execution of generated code with task.sandbox=unsafe"
    raise SandboxUnavailable(f"task.sandbox={requested}: cannot isolate generated code: {problem}; {hint}")


def configure(requested: str) -> str:
    """Set this process's isolation from `task.sandbox` (checked now, before any generation); returns it."""
    global _requested
    isolation = resolve_isolation(requested)
    _requested = requested
    return isolation


def active_isolation() -> str:
    return resolve_isolation(_requested)


def run_program(source: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> SandboxResult:
    """Execute `source` as a script in the sandbox; passed means it exited 0 within `timeout_s`."""
    isolation = active_isolation()
    with tempfile.TemporaryDirectory(prefix="specdec-sandbox-", ignore_cleanup_errors=True) as workdir:
        work = Path(workdir)
        (work / PROGRAM_FILE).write_text(source, encoding="utf-8")
        (work / BOOT_FILE).write_text(BOOT, encoding="utf-8")
        stderr_path = work / "stderr.txt"
        # output goes to files, not pipes: a chatty program cannot fill our memory or block on a pipe
        with open(work / "stdout.txt", "wb") as out, open(stderr_path, "wb") as err:
            command = [_python(), "-I", BOOT_FILE]
            if isolation == "bwrap":
                command = [*_bwrap_command(workdir), *command]
            proc = subprocess.Popen(
                command,
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

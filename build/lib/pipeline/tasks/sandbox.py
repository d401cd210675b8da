"""Run generated code (plus its tests) in a separate, isolated, resource-limited Python process.

Generated code is never executed in this process. Isolation (`task.sandbox`), chosen at run time:

- `bwrap` (bubblewrap; `auto` picks it when it can start): the program sees a read-only system
  (/usr, the Python installation, the dynamic loader's cache) and nothing else of the machine (no
  project, no home, no run outputs), its temp folder as the only writable path (the sandbox's root
  is remounted read-only, so a write anywhere else fails, whatever API makes it: `open`, `os.open`,
  `ctypes`; /proc and /dev read-only too), new network (no interface up), PID (no other process is
  visible or signalable), IPC and UTS namespaces, killed with its parent, its own session;
- `unshare` (root only; `auto` picks it where bwrap cannot start): new network, mount, PID, IPC and
  UTS namespaces; a read-only tmpfs root with read-only nosuid binds of the system and the Python
  installation, a read-only /proc/sys and a writable bind of the work dir; chroot;
- `unsafe`: no OS isolation, only the limits below; named so, and never chosen by `auto`.
  Where no tier can start, `auto` (or the tier asked for) refuses with one line saying why and how
  to install bubblewrap.

Run as root, both isolating tiers make the program uid/gid 65534 with no capabilities and no_new_privs (setpriv): as
the host's uid 0, even without capabilities, it would still pass the kernel's root checks (e.g.
writing /proc/sys). The work dir is handed to that uid (root's group keeps access for the tools). An
unprivileged user's program keeps that user's uid inside bwrap's user namespace (checked by hand
as uid 65534 with the system Python; the suite runs as root, as these machines do).

Inside every tier: a fresh temp dir as cwd, `python -I` (no user site, no PYTHON* env), a minimal
environment whose proxies point at a dead port, rlimits (address space, CPU, file size, no core
dumps), stdin closed, a session of its own so the whole process group is killed on timeout, output
to files read back through our own descriptor (the program may replace their names), the work dir
removed even when too deep for rmtree, and a boot prelude that makes sockets raise OSError and
turns the destructive os/shutil/subprocess calls into errors (a courtesy for honest programs; the isolation is the OS's).
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


SANDBOX_UID = 65534  # nobody: the program never runs as the host's root


def _drop_privileges() -> list[str]:
    """setpriv: uid/gid 65534, no groups, no capabilities, no_new_privs (setuid binaries stay unprivileged)."""
    return ["setpriv", f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_UID}", "--clear-groups", "--inh-caps=-all",
            "--bounding-set=-all", "--no-new-privs", "--"]


def _system_prefixes() -> list[str]:
    """The Python installation's folders outside /usr (pyenv, conda): bound read-only into the sandbox."""
    return [p for p in dict.fromkeys(os.path.realpath(q) for q in (sys.base_prefix, sys.prefix))
            if not Path(p).is_relative_to("/usr") and Path(_python()).is_relative_to(p)]


def _bwrap_command(workdir: str) -> list[str]:
    """bwrap's arguments: a read-only system, the work dir the only writable path, no network, own PID
    ns; the program itself then drops to uid 65534 (as real root, a uid-0 program would still be the
    host's root to the kernel, e.g. for /proc/sys, whatever its capabilities)."""
    as_root = os.geteuid() == 0
    cmd = ["bwrap", "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
           "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    if as_root:  # only for setpriv, which drops them all
        cmd += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"]
    else:  # an unprivileged user: bwrap's user namespace; the program keeps that user's uid, never root's
        cmd += ["--unshare-user"]
    cmd += ["--ro-bind", "/usr", "/usr", "--dev", "/dev", "--proc", "/proc"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(top):  # merged-/usr systems: /lib -> usr/lib
            cmd += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            cmd += ["--ro-bind", top, top]
    if os.path.exists("/etc/ld.so.cache"):
        cmd += ["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    for path in [*_system_prefixes(), workdir]:  # folders bwrap creates are 0700: let uid 65534 through
        for parent in reversed(Path(path).parents[:-1]):
            cmd += ["--perms", "0755", "--dir", str(parent)]
    for prefix in _system_prefixes():
        cmd += ["--ro-bind", prefix, prefix]
    # the root, /dev (its shm folder) and /proc (/proc/sys) read-only: only the work dir takes writes
    cmd += ["--bind", workdir, workdir, "--chdir", workdir, "--remount-ro", "/proc", "--remount-ro", "/dev",
            "--remount-ro", "/", *(_drop_privileges() if as_root else [])]
    return cmd


# The `unshare` tier (root only): new network, mount, PID, IPC and UTS namespaces; in the new mount
# namespace a read-only tmpfs root holding read-only binds of the system and the Python installation
# and a writable bind of the work dir; then chroot and drop to uid/gid 65534 with no capabilities.
UNSHARE_SCRIPT = r"""
set -euf
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
work="$1"; root="$2"; prefixes="$3"; shift 3
mount --make-rprivate /
mount -t tmpfs -o mode=755,nosuid,nodev sandbox "$root"
readonly_bind() { mount --bind "$1" "$2"; mount -o remount,bind,ro,nosuid,nodev "$2"; }
dirs="/usr:/bin:/sbin:/lib:/lib32:/lib64:$prefixes"
IFS=':'
for dir in $dirs; do
    if [ -L "$dir" ]; then mkdir -p "$root$(dirname "$dir")"; ln -s "$(readlink "$dir")" "$root$dir"
    elif [ -d "$dir" ]; then mkdir -p "$root$dir"; readonly_bind "$dir" "$root$dir"
    fi
done
unset IFS
mkdir -p "$root/dev" "$root/proc" "$root$work"
for node in null zero random urandom; do
    touch "$root/dev/$node"; mount --bind "/dev/$node" "$root/dev/$node"
    mount -o remount,bind,ro,nosuid "$root/dev/$node"
done
mount -t proc -o nosuid,nodev,noexec proc "$root/proc"
readonly_bind "$root/proc/sys" "$root/proc/sys"
mount --bind "$work" "$root$work"
mount -o remount,bind,nosuid,nodev "$root$work"
mount -o remount,ro,bind "$root"
# no exec: this shell stays the namespace's first process, in the host's process group, so killing
# that group on a timeout ends the namespace and everything in it (the program may setsid)
chroot "$root" setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all --bounding-set=-all \
    --no-new-privs -- sh -c 'cd "$0" && exec "$@"' "$work" "$@"
"""


def _unshare_command(workdir: str, root: str) -> list[str]:
    return ["unshare", "--net", "--mount", "--pid", "--ipc", "--uts", "--fork", "--kill-child", "--",
            "sh", "-c", UNSHARE_SCRIPT, "unshare-sandbox", workdir, root, ":".join(_system_prefixes())]


def _python() -> str:
    return os.path.realpath(sys.executable)  # a venv's symlink may live in a folder the sandbox hides


_SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


def _start_problem(isolation: str) -> str | None:
    """Start `python -I -c pass` under `isolation` exactly as a program starts; None when it ran, else
    the last line it printed."""
    with tempfile.TemporaryDirectory(prefix="specdec-sandbox-probe-") as workdir:
        try:
            proc = _run_isolated(isolation, workdir, [_python(), "-I", "-c", "pass"], cwd=workdir,
                                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, env={"PATH": _SYSTEM_PATH})
            try:
                _, err = proc.communicate(timeout=30)
            finally:
                _cleanup(proc)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{isolation} did not start ({exc})"
    if proc.returncode == 0:
        return None
    return (err.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]


@functools.cache
def _bwrap_problem() -> str | None:
    """Why bwrap cannot run a program here, or None when it can (probed once per process)."""
    if _shutil.which("bwrap") is None:
        return "bwrap is not installed (Debian/Ubuntu: apt install bubblewrap)"
    problem = _start_problem("bwrap")
    return None if problem is None else f"bwrap cannot start here ({problem}; user namespaces may be disabled)"


def _hand_over(workdir: str) -> None:
    """The work dir becomes the program's (uid 65534) and stays reachable by root's group only (the
    isolation tools run as root without capabilities, so they need the group bits), no one else's."""
    if os.geteuid() != 0:  # an unprivileged user's program runs as that user: its own 0700 dir is right
        return
    os.chown(workdir, SANDBOX_UID, 0)
    os.chmod(workdir, 0o770)


def _run_isolated(isolation: str, workdir: str, command: list[str], **popen) -> subprocess.Popen:
    """Start `command` in `workdir` under `isolation` (the work dir becomes writable by the sandbox's uid)."""
    if isolation == "bwrap":
        _hand_over(workdir)
        return subprocess.Popen([*_bwrap_command(workdir), *command], **popen)
    if isolation == "unshare":
        _hand_over(workdir)
        root = tempfile.mkdtemp(prefix="specdec-sandbox-root-")  # its mount point, empty on the host side
        proc = subprocess.Popen([*_unshare_command(workdir, root), *command], **popen)
        proc.sandbox_root = root
        return proc
    return subprocess.Popen(command, **popen)


def _cleanup(proc: subprocess.Popen) -> None:
    root = getattr(proc, "sandbox_root", None)
    if root is not None:
        try:
            os.rmdir(root)
        except OSError:
            pass


@functools.cache
def _unshare_problem() -> str | None:
    """Why the unshare tier cannot run a program here, or None when it can (probed once per process)."""
    if os.geteuid() != 0:
        return "the unshare tier needs root (unprivileged users: install bubblewrap)"
    missing = [tool for tool in ("unshare", "setpriv", "chroot", "mount") if _shutil.which(tool, path=_SYSTEM_PATH) is None]
    if missing:
        return f"{', '.join(missing)} not found (util-linux, coreutils)"
    problem = _start_problem("unshare")
    return None if problem is None else f"unshare cannot start here ({problem})"


def resolve_isolation(requested: str = "auto") -> str:
    """The isolation generated code will run under for `task.sandbox=requested`: bwrap, unshare or unsafe."""
    if requested not in ISOLATIONS:
        raise SandboxUnavailable(f"task.sandbox={requested} is not an option; choose one of: {', '.join(ISOLATIONS)}")
    if requested == "unsafe":
        return "unsafe"
    hint = "install bubblewrap (apt install bubblewrap), or opt in to unisolated execution with task.sandbox=unsafe"
    problems = []
    for tier, probe in (("bwrap", _bwrap_problem), ("unshare", _unshare_problem)):
        if requested in ("auto", tier):
            problem = probe()
            if problem is None:
                return tier
            problems.append(problem)
    raise SandboxUnavailable(f"task.sandbox={requested}: cannot isolate generated code: {'; '.join(problems)}; {hint}")


def configure(requested: str) -> str:
    """Set this process's isolation from `task.sandbox` (checked now, before any generation); returns it."""
    global _requested
    isolation = resolve_isolation(requested)
    _requested = requested
    return isolation


def active_isolation() -> str:
    return resolve_isolation(_requested)


def _remove(workdir: str) -> None:
    """Remove the work dir whatever the program left there (a tree too deep for rmtree's recursion too)."""
    try:
        _shutil.rmtree(workdir)
    except Exception:  # noqa: BLE001 - RecursionError on a deep tree is not an OSError
        subprocess.run(["rm", "-rf", "--one-file-system", workdir], capture_output=True, timeout=60)


def _last_line(fh) -> str:
    """The last line of the stderr we opened (read from our descriptor: the program may have replaced the
    file's name by a symlink or a FIFO)."""
    fh.flush()
    size = os.fstat(fh.fileno()).st_size
    fh.seek(max(0, size - 4096))
    lines = fh.read(4096).decode("utf-8", "replace").strip().splitlines()
    return lines[-1][:300] if lines else ""


def run_program(source: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> SandboxResult:
    """Execute `source` as a script in the sandbox; passed means it exited 0 within `timeout_s`."""
    isolation = active_isolation()
    workdir = tempfile.mkdtemp(prefix="specdec-sandbox-")
    try:
        work = Path(workdir)
        (work / PROGRAM_FILE).write_text(source, encoding="utf-8")
        (work / BOOT_FILE).write_text(BOOT, encoding="utf-8")
        # output goes to files, not pipes: a chatty program cannot fill our memory or block on a pipe
        with open(work / "stdout.txt", "wb") as out, open(work / "stderr.txt", "w+b") as err:
            proc = _run_isolated(
                isolation, workdir, [_python(), "-I", BOOT_FILE],
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
                _cleanup(proc)
            detail = _last_line(err)
    finally:
        _remove(workdir)
    if isolation == "unshare" and code > 128:  # the namespace's shell reports a signal as 128 + its number
        code = 128 - code
    if code == 0:
        return SandboxResult(True, "passed")
    if code == -signal.SIGXCPU:
        return SandboxResult(False, "timeout", "CPU time limit exceeded")
    if detail.startswith("AssertionError"):
        return SandboxResult(False, "failed", detail)
    return SandboxResult(False, "error", detail or f"exit code {code}")

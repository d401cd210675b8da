"""A throwaway single-node Slurm cluster in one directory (config, state, spool, munge key and
socket), for the Slurm tests and for trying `hydra/launcher=slurm` on a workstation.

Needs Debian's `slurmctld slurmd slurm-client munge` packages and root (slurmd runs jobs as the
submitting user). No systemd, no cgroups (`proctrack/pgid`, `task/none`), no accounting database:
`sacct` fails, which submitit tolerates and `pipeline.launcher` works around (it asks `squeue`).

    python -m pipeline.local_slurm /tmp/slurm      # prints `export SLURM_CONF=...`; Ctrl-C stops it
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo")
START_TIMEOUT_S = 60


def wait_until(condition, what: str, timeout: float):
    """Poll `condition` until it returns something truthy (returned); fail after `timeout` seconds."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def missing_binaries() -> list[str]:
    return [b for b in BINARIES if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]


def _binary(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _node_line(host: str) -> str:
    """The node's real CPUs/memory (`slurmd -C`), so jobs asking for --mem are schedulable."""
    out = subprocess.run([_binary("slurmd"), "-C"], capture_output=True, text=True, timeout=30).stdout
    fields = dict(kv.split("=", 1) for kv in out.split()[:8] if "=" in kv)
    cpus, memory = fields.get("CPUs", str(os.cpu_count() or 1)), fields.get("RealMemory", "1000")
    return f"NodeName={host} CPUs={cpus} RealMemory={memory} State=UNKNOWN"


class LocalSlurm:
    """Start with `start()` (or as a context manager); `env` holds SLURM_CONF for the clients."""

    def __init__(self, root: Path, partition: str = "debug"):
        self.root = Path(root).resolve()
        self.partition = partition
        self.host = socket.gethostname()
        self.conf = self.root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self._procs: list[subprocess.Popen] = []

    def write_config(self) -> None:
        d = self.root
        for sub in ("state", "spool", "log"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        key = d / "munge.key"
        if not key.exists():
            key.write_bytes(secrets.token_bytes(1024))
            key.chmod(0o400)
        self.conf.write_text("\n".join([
            "ClusterName=specdec-test",
            f"SlurmctldHost={self.host}",
            "AuthType=auth/munge",
            f"AuthInfo=socket={d / 'munge.sock'}",
            "SlurmUser=root",
            f"SlurmctldPort={_free_port()}",
            f"SlurmdPort={_free_port()}",
            f"StateSaveLocation={d / 'state'}",
            f"SlurmdSpoolDir={d / 'spool'}",
            f"SlurmctldPidFile={d / 'slurmctld.pid'}",
            f"SlurmdPidFile={d / 'slurmd.pid'}",
            f"SlurmctldLogFile={d / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={d / 'log' / 'slurmd.log'}",
            "ProctrackType=proctrack/pgid",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "MpiDefault=none",
            "ReturnToService=2",
            "KillWait=5",  # seconds between SIGTERM and SIGKILL when a job is cancelled or requeued
            "MinJobAge=300",  # keep finished jobs visible to squeue/scontrol for a while
            _node_line(self.host),
            f"PartitionName={self.partition} Nodes={self.host} Default=YES MaxTime=INFINITE State=UP",
            "",
        ]))

    def start(self) -> "LocalSlurm":
        if missing_binaries():
            raise RuntimeError(f"Slurm/munge binaries not found: {', '.join(missing_binaries())}")
        self.write_config()
        d = self.root
        self._spawn([_binary("munged"), "--foreground", "--force", f"--socket={d / 'munge.sock'}",
                     f"--key-file={d / 'munge.key'}", f"--pid-file={d / 'munged.pid'}",
                     f"--log-file={d / 'log' / 'munged.log'}", f"--seed-file={d / 'munge.seed'}"], "munged")
        self._wait(lambda: (d / "munge.sock").exists(), "munged socket")
        self._spawn([_binary("slurmctld"), "-D", "-i", "-f", str(self.conf)], "slurmctld")
        self._wait(lambda: self._ok(["scontrol", "ping"]) and "UP" in self._out(["scontrol", "ping"]), "slurmctld")
        self._spawn([_binary("slurmd"), "-D", "-f", str(self.conf)], "slurmd")
        self._wait(self._node_idle, "an idle node in sinfo")
        return self

    def stop(self) -> None:
        """Cancel every job first (or slurmstepd processes linger), then stop the daemons we own."""
        if self._procs:
            subprocess.run(["scancel", "--full", "--partition", self.partition], env=self.env,
                           capture_output=True, timeout=30)
            deadline = time.time() + 30
            while time.time() < deadline and self._out(["squeue", "-h", "-o", "%i"]).strip():
                time.sleep(0.5)
        for proc in reversed(self._procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)
        self._procs = []

    def __enter__(self) -> "LocalSlurm":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def log_tail(self, lines: int = 30) -> str:
        out = []
        for name in ("slurmctld", "slurmd", "munged"):
            path = self.root / "log" / f"{name}.log"
            if path.exists():
                out.append(f"--- {path}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:]))
        return "\n".join(out)

    def _spawn(self, cmd: list[str], name: str) -> None:
        log = (self.root / "log" / f"{name}.stdout").open("ab")
        self._procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                            start_new_session=True))

    def _wait(self, ready, what: str) -> None:
        deadline = time.time() + START_TIMEOUT_S
        while time.time() < deadline:
            if ready():
                return
            dead = [p.args[0] for p in self._procs if p.poll() is not None]
            if dead:
                break
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"local Slurm did not start ({what}; exited: {dead or 'none'})\n{self.log_tail()}")

    def _node_idle(self) -> bool:
        return "idle" in self._out(["sinfo", "-h", "-N", "-o", "%T"])

    def _ok(self, cmd: list[str]) -> bool:
        return subprocess.run(cmd, env=self.env, capture_output=True, timeout=30).returncode == 0

    def _out(self, cmd: list[str]) -> str:
        return subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=30).stdout


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m pipeline.local_slurm <dir>")
    with LocalSlurm(Path(sys.argv[1])) as cluster:
        print(f"export SLURM_CONF={cluster.conf}\n(Ctrl-C stops the cluster)", flush=True)
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()

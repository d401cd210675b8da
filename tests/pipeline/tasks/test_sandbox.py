"""The code sandbox: pass/fail/timeout/error, limits, and that nothing runs in-process."""

import os

from pipeline.tasks.sandbox import run_program


def test_pass_and_assertion_failure():
    assert run_program("assert sum([1, 2]) == 3\n").reason == "passed"
    result = run_program("assert 1 == 2, 'wrong'\n")
    assert not result.passed and result.reason == "failed" and "wrong" in result.detail


def test_other_exceptions_are_errors():
    result = run_program("def f(:\n")
    assert result.reason == "error" and "SyntaxError" in result.detail


def test_infinite_loop_times_out():
    assert run_program("while True:\n    pass\n", timeout_s=2).reason == "timeout"
    assert run_program("import time\ntime.sleep(60)\n", timeout_s=1).reason == "timeout"


def test_network_is_blocked():
    for code in (
        "import socket\nsocket.socket(socket.AF_INET, socket.SOCK_STREAM).connect(('127.0.0.1', 9))\n",
        "import socket\nsocket.create_connection(('example.com', 80), timeout=1)\n",
        "import _socket\n_socket.socket()\n",
    ):
        result = run_program(code)
        assert not result.passed and "network access is disabled" in result.detail, code


def test_memory_limit():
    result = run_program("x = bytearray(4 * 1024 ** 3)\n")
    assert not result.passed and "MemoryError" in result.detail


def test_file_size_limit():
    result = run_program("open('big.bin', 'wb').write(b'x' * (50 << 20))\n")
    assert not result.passed and "File too large" in result.detail


def test_code_runs_in_a_fresh_directory_not_in_process(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    marker = "sandbox_marker_xyz"
    code = (
        f"import os\nopen('{marker}.txt', 'w').write('hi')\nos.environ['{marker}'] = '1'\n"
        f"assert os.path.exists('{marker}.txt')\n"
    )
    assert run_program(code).passed
    assert not (tmp_path / f"{marker}.txt").exists()
    assert marker not in os.environ


def test_early_exit_is_not_a_pass():
    result = run_program("import sys\nsys.exit(0)\nassert False\n")
    assert not result.passed and "SystemExit" in result.detail


def test_main_guard_does_not_run():
    # a model's demo block would otherwise block on stdin or exit before the tests
    assert run_program("if __name__ == '__main__':\n    input()\nassert True\n").passed


def test_destructive_calls_are_disabled():
    result = run_program("import os\nos.system('true')\n")
    assert not result.passed and "disabled in the sandbox" in result.detail


# ---------------------------------------------------------------- OS isolation (bubblewrap)
# Escape probes as a hostile program would write them, through ctypes where a Python-level patch
# could be bypassed. Each must fail inside the sandbox and leave no trace outside it.
import socket  # noqa: E402
import subprocess  # noqa: E402

import pytest  # noqa: E402

from pipeline.tasks import sandbox  # noqa: E402

LIBC = "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"


@pytest.fixture(params=["bwrap", "unshare"])
def isolated(request):
    """Each probe under both isolation tiers (CI installs bubblewrap, .ci/run, and runs as root)."""
    assert sandbox.configure(request.param) == request.param
    yield request.param
    sandbox.configure("auto")


def test_auto_picks_bubblewrap_first():
    assert sandbox.configure("auto") == "bwrap"


@pytest.mark.parametrize("how", ["open", "os.open", "ctypes"])
def test_writing_outside_the_program_folder_fails_and_leaves_nothing(how, tmp_path, isolated):
    target = tmp_path / f"escaped_{how.replace('.', '_')}.txt"
    program = {
        "open": f"open({str(target)!r}, 'w').write('x')\n",
        "os.open": f"import os\nos.open({str(target)!r}, os.O_CREAT | os.O_WRONLY, 0o644)\n",
        "ctypes": LIBC + f"fd = libc.open({str(target).encode()!r}, os.O_CREAT | os.O_WRONLY, 0o644)\n"
                         "assert fd >= 0, ctypes.get_errno()\n",
    }[how]
    assert not sandbox.run_program(program).passed
    assert not target.exists()
    for shared in ("/tmp", "/dev/shm"):  # nor anywhere writable by everyone
        assert not sandbox.run_program(LIBC + f"fd = libc.open(b'{shared}/specdec_escape', os.O_CREAT | os.O_WRONLY, "
                                              "0o644)\nassert fd >= 0\n").passed
        assert not os.path.exists(f"{shared}/specdec_escape")


def test_a_tcp_connection_through_ctypes_to_a_local_listener_fails(isolated):
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(1.0)  # bounded: the test stops by itself
    port = listener.getsockname()[1]
    program = LIBC + (
        "import struct\n"
        "fd = libc.socket(2, 1, 0)\n"  # AF_INET, SOCK_STREAM
        f"addr = struct.pack('<HH4s8x', 2, {socket.htons(port)}, bytes([127, 0, 0, 1]))\n"
        "assert libc.connect(fd, addr, len(addr)) == 0, ctypes.get_errno()\n")
    try:
        result = sandbox.run_program(program)
        with pytest.raises(socket.timeout):
            listener.accept()
    finally:
        listener.close()
    assert result.reason == "failed"  # connect() returned an error inside the sandbox


def test_killing_another_process_of_the_same_user_through_ctypes_fails(isolated):
    victim = subprocess.Popen(["sleep", "60"])
    try:
        result = sandbox.run_program(LIBC + f"assert libc.kill({victim.pid}, 9) == 0, ctypes.get_errno()\n")
        assert result.reason == "failed"
        assert victim.poll() is None  # still alive
    finally:
        victim.kill()
        victim.wait()


def test_the_results_of_a_run_in_progress_are_not_reachable(tmp_path, isolated):
    results = tmp_path / "outputs" / "runs" / "results.jsonl"
    results.parent.mkdir(parents=True)
    results.write_text('{"id": "HumanEval/0", "outputs": ["secret"]}\n')
    for program in (f"print(open({str(results)!r}).read())\n",
                    LIBC + f"assert libc.open({str(results).encode()!r}, os.O_RDONLY) >= 0\n",
                    f"import os\nassert os.path.exists({str(sandbox.__file__)!r})\n"):  # nor the project
        assert not sandbox.run_program(program).passed
    assert results.read_text().endswith('"secret"]}\n')


def _sleepers(marker: str) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if marker.encode() in fh.read():
                    found.append(pid)
        except OSError:
            continue
    return found


def _gone(marker: str, within_s: float = 10.0) -> bool:
    """No process with `marker` left, waiting (bounded) for the kernel to tear the PID namespace down:
    its processes are killed when its first process dies, which happens just after our kill returns."""
    import time

    deadline = time.monotonic() + within_s
    while _sleepers(marker):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_processes_the_program_spawns_die_with_it(isolated):
    marker = "37.125"
    program = LIBC + (
        "if libc.fork() == 0:\n"
        f"    libc.execl(b'/usr/bin/sleep', b'sleep', b'{marker}', None)\n"
        "import time\ntime.sleep(0.3)\n")  # the child is running when the program ends
    assert sandbox.run_program(program).passed
    assert _gone(marker)


def test_a_correct_humaneval_solution_passes_isolated(isolated):
    from pipeline.tasks.scoring import SCORERS

    reference = {"prompt": "def add(a, b):\n", "test": "def check(f):\n    assert f(2, 3) == 5\n", "entry_point": "add"}
    assert SCORERS["humaneval"]("    return a + b\n", reference) == {"pass@1": 1.0}
    assert SCORERS["humaneval"]("    return a - b\n", reference) == {"pass@1": 0.0}


def test_without_either_tier_auto_refuses_with_one_line_and_unsafe_is_an_explicit_opt_in(monkeypatch):
    monkeypatch.setattr(sandbox._shutil, "which", lambda name, path=None: None)
    sandbox._bwrap_problem.cache_clear()
    sandbox._unshare_problem.cache_clear()
    try:
        for requested in ("auto", "bwrap", "unshare"):
            with pytest.raises(sandbox.SandboxUnavailable) as info:
                sandbox.configure(requested)
            message = str(info.value)
            assert "\n" not in message and "apt install bubblewrap" in message and "task.sandbox=unsafe" in message
        assert sandbox.configure("unsafe") == "unsafe"
        assert sandbox.run_program("assert 1 + 1 == 2\n").passed  # the old limits-only path still works
    finally:
        monkeypatch.undo()
        sandbox._bwrap_problem.cache_clear()
        sandbox._unshare_problem.cache_clear()
        sandbox.configure("auto")


def test_the_program_is_unprivileged_and_cannot_write_kernel_settings(isolated):
    status = "open('/proc/self/status').read()"
    assert sandbox.run_program(f"import os\nassert os.getuid() == os.geteuid() == 65534\n"
                               f"assert {status}.split('NoNewPrivs:')[1].split()[0] == '1'\n"
                               f"assert {status}.split('CapEff:')[1].split()[0] == '0' * 16\n").passed
    assert not sandbox.run_program(LIBC + "fd = libc.open(b'/proc/sys/kernel/core_pattern', os.O_WRONLY)\n"
                                          "assert fd >= 0, ctypes.get_errno()\n").passed


def test_a_program_that_leaves_its_session_does_not_outlive_its_timeout(isolated):
    marker = "41.375"
    program = LIBC + f"libc.setsid()\nif libc.fork() == 0:\n    libc.setsid()\n" \
                     f"libc.execl(b'/usr/bin/sleep', b'sleep', b'{marker}', None)\n"
    assert sandbox.run_program(program, timeout_s=1).reason == "timeout"
    assert _gone(marker)


def test_a_stderr_replaced_by_a_symlink_is_not_followed(isolated):
    program = LIBC + ("libc.unlink(b'stderr.txt')\n"
                      f"libc.symlink({str(sandbox.__file__).encode()!r}, b'stderr.txt')\n"
                      "import sys\nsys.stderr.write('AssertionError: mine\\n')\nraise SystemExit(1)\n")
    result = sandbox.run_program(program)
    # what the program wrote last (the boot's exit line), not the last line of the symlink's target
    assert result.detail.startswith("SystemExit: the program exited (1)")


def test_a_directory_tree_too_deep_for_rmtree_is_still_cleaned_up(isolated):
    before = {p for p in os.listdir("/tmp") if p.startswith("specdec-sandbox-")}
    result = sandbox.run_program("import os\nfor _ in range(1200):\n    os.mkdir('d')\n    os.chdir('d')\n")
    assert result.passed
    assert {p for p in os.listdir("/tmp") if p.startswith("specdec-sandbox-")} <= before

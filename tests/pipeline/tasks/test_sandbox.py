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

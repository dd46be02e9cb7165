"""An interrupted test run leaves nothing running (tests/interrupt.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD_TEST = """
import subprocess, sys, time
from pathlib import Path
import pytest

@pytest.fixture
def server():
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    Path("child.pid").write_text(str(process.pid))
    try:
        yield process
    finally:
        process.kill()
        process.wait()

def test_long(server):
    time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_sigterm_to_pytest_stops_the_processes_its_fixtures_started(tmp_path: Path):
    (tmp_path / "test_child.py").write_text(CHILD_TEST)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.interrupt"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        pid_file = tmp_path / "child.pid"
        deadline = time.monotonic() + 60
        while not pid_file.exists() and time.monotonic() < deadline and run.poll() is None:
            time.sleep(0.1)
        assert pid_file.exists(), run.communicate(timeout=10)[0].decode()
        child = int(pid_file.read_text())
        assert _alive(child)
        run.send_signal(signal.SIGTERM)
        out = run.communicate(timeout=60)[0].decode()
        assert "KeyboardInterrupt" in out
        assert not _alive(child)  # killed and reaped by the fixture's teardown
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        if (tmp_path / "child.pid").exists():
            child = int((tmp_path / "child.pid").read_text())
            if _alive(child):
                os.kill(child, signal.SIGKILL)

"""``proxy.workers.WorkerProc``: the supervisor follows its workers by pid, its own children
and the ones it adopts (a successor an old worker started, not yet the supervisor's child while
that worker lives)."""

from __future__ import annotations

import signal
import subprocess
import time

from proxy.workers import WorkerProc


def _until(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_a_child_is_reaped_with_its_exit_code():
    proc = WorkerProc.spawn(["sleep", "30"])
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    assert _until(lambda: proc.poll() is not None)
    assert proc.returncode == -signal.SIGTERM
    proc.send_signal(signal.SIGTERM)  # gone: nothing to signal, no error


def test_a_process_that_is_not_a_child_is_followed_until_it_is_gone():
    # A shell starts a sleep in the background and exits: the sleep is nobody's child here.
    out = subprocess.run(["sh", "-c", "sleep 30 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True, check=True)
    adopted = WorkerProc(int(out.stdout))
    assert adopted.poll() is None  # alive, though waitpid cannot see it
    adopted.kill()
    assert _until(lambda: adopted.poll() is not None)
    assert adopted.returncode == -1  # its exit code went to its own parent

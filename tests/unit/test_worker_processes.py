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


class _Gone:
    """A worker that died (``poll`` says how)."""

    pid = 4242
    returncode = -9

    def poll(self) -> int:
        return -9


async def test_a_worker_that_dies_is_restarted_at_once_unless_it_dies_young(autojump_clock, nursery, tmp_path, monkeypatch):
    """Its clients wait for the new worker (the keeper hands them over): a worker that had been
    up a while is started again within the supervisor's next look (0.2 s); one that dies soon
    after its start is in a crash loop, and its restarts back off (0.5, 1, 2 s...)."""
    import trio

    from proxy.config import load_config
    from proxy.workers import Supervisor

    path = tmp_path / "proxy.toml"
    path.write_text('name = "t"\n[listen]\naddress = "127.0.0.1:4000"\nworkers = 2\n[backend]\naddresses = ["127.0.0.1:4001"]\n'
                    '[[users]]\nname = "app"\npassword = "x"\n')  # fmt: skip
    sup = Supervisor(load_config(str(path)), str(path), 2)
    spawned: list[float] = []

    def spawn(index: int) -> None:
        spawned.append(trio.current_time())
        sup.procs[index] = _Alive()
        sup.started_at[index] = trio.current_time()

    monkeypatch.setattr(sup, "_spawn", spawn)
    sup.procs = [_Alive(), _Alive()]
    sup.started_at = {0: trio.current_time(), 1: trio.current_time()}
    nursery.start_soon(sup.watch)
    await trio.sleep(60)  # up a minute: not young
    died = trio.current_time()
    sup.procs[0] = _Gone()
    await trio.sleep(1)
    assert len(spawned) == 1 and spawned[0] - died <= 0.21
    for expected in (0.5, 1.0, 2.0):  # dying a second after each start: a crash loop
        await trio.sleep(1)
        died = trio.current_time()
        sup.procs[0] = _Gone()
        await trio.sleep(expected + 1)
        assert spawned[-1] - died >= expected and spawned[-1] - died <= expected + 0.21, (expected, spawned[-1] - died)
    assert sup.restarts == 4


class _Alive:
    pid = 4141
    returncode = None

    def poll(self) -> None:
        return None

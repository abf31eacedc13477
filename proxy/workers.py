"""``--workers N``: N processes share the listen port (SO_REUSEPORT), each an independent trio
loop with its own sessions, so the proxy uses every core.

The supervisor (the process started by the operator) does not serve clients. It starts the
workers (``python -m proxy --config ... --worker i/N``), restarts one that dies (and logs it),
forwards SIGTERM/SIGINT/SIGHUP to all of them, and serves the one admin endpoint: /metrics
and /status gather every worker's (each worker serves its own on a private loopback port,
``WorkerInfo.admin_ports``), /readyz is ready when any worker is.

An upgrade (SIGUSR2 to the supervisor, or POST /upgrade on its admin endpoint, which
``replay-proxy upgrade`` sends) first runs ``--check`` of the code and config on disk, then
upgrades one worker after the other as a single process is upgraded: the worker starts its
successor (the same worker index, the new code) and hands it its listener, its private admin
port and its sessions with their connections (``proxy.handover``), then drains and exits. The
supervisor is every worker's subreaper, so a successor becomes its child when the old worker
exits. Last, the supervisor re-executes itself in place (the same pid, so systemd's main PID
stays right) with the new code, keeping its admin listener and its workers (``_INHERITANCE``).
A worker that fails to take over stops the upgrade there: it and the rest serve on with the
code they run, and the answer says which workers run which.

Session ids stay unique: worker ``i`` numbers its sessions from 1,000,000,001 + i * 5 * 10^7
(``WorkerInfo.first_session_id``; 64 workers at most, so every id fits the greeting's 4 bytes);
a ``KILL <id>`` of another worker's session is translated
by asking that worker (``/session?id=``). Commit-marker slots are random per session.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import trio

from proxy.config import Config, ConfigError, load_config
from proxy.handover import sdnotify
from proxy.handover.keeper import SessionKeeper
from proxy.handover.upgrade import START_TIMEOUT, UpgradeFailed, WorkersOutcome, upgrade_logged
from proxy.worker_identity import MAX_WORKERS, SESSION_ID_BASE, SESSION_ID_SPAN, WorkerInfo, get_json

__all__ = ["WorkerInfo", "supervise", "SESSION_ID_BASE", "SESSION_ID_SPAN", "MAX_WORKERS"]

log = logging.getLogger("replay_proxy.workers")


def _free_loopback_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _die_with_supervisor() -> None:
    """In a new worker, before it execs: SIGTERM (its drain) when the supervisor dies, even by
    SIGKILL. A worker left behind would go on serving the shared port (SO_REUSEPORT) beside the
    next supervisor's, under a config nobody reloads."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() == 1:  # the supervisor died before the line above
        os.kill(os.getpid(), signal.SIGTERM)


async def watch_supervisor(supervisor_pid: int) -> None:
    """In a worker an upgrade started (its parent is the worker it replaces): once that one has
    exited and this one is the supervisor's child, die with the supervisor as its own workers
    do; a parent that is neither means the supervisor is gone: drain (SIGTERM)."""
    first_parent = os.getppid()
    while True:
        parent = os.getppid()
        if parent == supervisor_pid:
            _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
            if os.getppid() == supervisor_pid:
                return
        elif parent != first_parent:
            log.error("the supervisor (pid %d) is gone: this worker stops", supervisor_pid)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        await trio.sleep(1)


def _prctl(option: int, value: int) -> None:
    ctypes.CDLL(None, use_errno=True).prctl(option, value)


_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_INHERITANCE = "REPLAY_PROXY_SUPERVISOR"  # what a supervisor leaves its re-executed self
_HANDOFF_GRACE = 0.5  # seconds between the answer to POST /upgrade and the supervisor's re-exec
_WATCH_EVERY = 0.2  # how often the supervisor looks for a dead worker (its clients wait meanwhile)
_LIVED = 10.0  # a worker that dies sooner after its start is in a crash loop: its restarts back off


def supervisor_reexecuted() -> bool:
    """This process is a supervisor that re-executed itself in an upgrade."""
    return _INHERITANCE in os.environ


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


class WorkerProc:
    """A worker process by pid: one the supervisor started, or one it adopted (started by the
    worker it replaced, a child of the supervisor once that one exits; or started before the
    supervisor re-executed itself)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    @classmethod
    def spawn(cls, args: list[str]) -> WorkerProc:
        env = {k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"}  # systemd hears the supervisor only
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, preexec_fn=_die_with_supervisor, env=env)
        proc.returncode = 0  # reaped here (poll), never by subprocess
        return cls(proc.pid)

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:  # not a child yet: the worker that started it still runs
            if not _running(self.pid):
                self.returncode = -1  # gone (or a zombie another parent reaps): its code is not ours
            return self.returncode
        if pid == 0:
            return None
        self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Supervisor:
    def __init__(self, config: Config, path: str, count: int) -> None:
        self.config = config
        self.path = path
        self.count = count
        self.ports = _free_loopback_ports(count)
        self.procs: list[WorkerProc | None] = [None] * count
        self.retiring: list[WorkerProc] = []  # upgraded workers draining what did not move
        self.stopping = False
        self.restarts = 0
        self.upgrading = False
        self.upgrading_worker: int | None = None  # not restarted by watch() while it hands over
        self.started_at: dict[int, float] = {}  # when the supervisor last started each worker (trio clock)
        self.admin_listeners: list[trio.SocketListener] = []
        self.inherited_admin: list[socket.socket] | None = None
        self.reexec_due = trio.Event()
        # Holds every worker's clients, so that a worker's crash loses none (listen.takeover).
        self.keeper = SessionKeeper(os.getpid(), config.listen.takeover_timeout) if config.listen.takeover else None
        self._inherit()

    def _inherit(self) -> None:
        """After a re-exec: the workers, their ports and the admin listener of the old image."""
        raw = os.environ.pop(_INHERITANCE, None)
        if raw is None:
            return
        state = json.loads(raw)  # the re-exec passed --workers as it ran: the same count
        self.ports = state["ports"]
        self.procs = [WorkerProc(pid) if pid else None for pid in state["procs"]]
        self.retiring = [WorkerProc(pid) for pid in state["retiring"]]
        self.restarts = state["restarts"]
        sockets = [socket.socket(fileno=fd) for fd in state["admin_fds"]]
        for sock in sockets:
            sock.set_inheritable(False)
        if self.config.admin.enabled and state["admin_address"] == str(self.config.admin_address):
            self.inherited_admin = sockets
        else:
            for sock in sockets:
                sock.close()
        log.info("supervisor pid %d re-executed with the code on disk: workers %s kept", os.getpid(),
                 ", ".join(f"{i} (pid {p.pid})" for i, p in enumerate(self.procs) if p is not None))  # fmt: skip

    def _spawn(self, index: int) -> None:
        args = [sys.executable, "-m", "proxy", "--config", self.path,
                *WorkerInfo(index, self.count, tuple(self.ports)).arguments(os.getpid())]  # fmt: skip
        self.procs[index] = WorkerProc.spawn(args)
        self.started_at[index] = trio.current_time()
        log.info("worker %d/%d started (pid %d)", index, self.count, self.procs[index].pid)

    def live(self) -> list[WorkerProc]:
        return [p for p in [*self.procs, *self.retiring] if p is not None and p.poll() is None]

    def signal_all(self, signum: int) -> None:
        for proc in self.live():
            proc.send_signal(signum)

    async def watch(self) -> None:
        """Restart a worker that dies while the proxy is not stopping (at once: its clients wait
        for it, ``keeper``; after a growing pause when it died soon after its start, a crash
        loop); reap upgraded ones."""
        failures: dict[int, list[float]] = {}
        while True:
            await trio.sleep(_WATCH_EVERY)
            for proc in [p for p in self.retiring if p.poll() is not None]:
                self.retiring.remove(proc)
                log.info("upgraded worker pid %d exited with code %s", proc.pid, proc.returncode)
            for i, proc in enumerate(self.procs):
                if proc is None or proc.poll() is None or self.stopping or i == self.upgrading_worker:
                    continue
                now = trio.current_time()
                recent = [t for t in failures.get(i, []) if now - t < 60]
                if now - self.started_at.get(i, now - _LIVED) < _LIVED:  # died young: a crash loop backs off
                    recent.append(now)
                failures[i] = recent
                delay = min(30.0, 0.5 * 2 ** (len(recent) - 1)) if recent else 0.0
                log.error("worker %d (pid %d) exited with code %s; restarting it in %.1fs", i, proc.pid, proc.returncode, delay)
                self.procs[i] = None
                self.restarts += 1
                await trio.sleep(delay)
                if not self.stopping:
                    self._spawn(i)

    async def run(self) -> None:
        _prctl(_PR_SET_CHILD_SUBREAPER, 1)  # a worker an old worker started becomes ours when that one exits
        for i in range(self.count):
            if self.procs[i] is None:
                self._spawn(i)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.watch)
            if self.keeper is not None:
                await nursery.start(self.keeper.serve)
            if self.config.admin.enabled:
                await nursery.start(serve_gathering_admin, self)
            nursery.start_soon(self._reexec_when_due)
            sdnotify.notify("READY=1")  # a Type=notify unit: the supervisor is up, its workers starting
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR2) as signals:
                async for signum in signals:
                    if signum == signal.SIGUSR2:
                        nursery.start_soon(upgrade_logged, self, "SIGUSR2")
                        continue
                    if signum == signal.SIGHUP:
                        log.info("SIGHUP: reloading every worker's config")
                        self.reload()
                        self.signal_all(signal.SIGHUP)
                        continue
                    log.info("received %s: stopping %d workers", signal.Signals(signum).name, self.count)
                    self.stopping = True
                    if self.keeper is not None:
                        self.keeper.stop()
                    self.signal_all(signal.SIGTERM)
                    await self._wait_all(self.config.listen.drain_timeout + 10)
                    nursery.cancel_scope.cancel()
                    break

    def reload(self) -> None:
        """The supervisor's own part of a SIGHUP: the admin token it checks (the workers reload
        the rest). An invalid file keeps the running config, as the workers do."""
        try:
            self.config = load_config(self.path)
        except ConfigError as exc:
            log.error("SIGHUP: the supervisor keeps its config: %s", str(exc).replace("\n", "; "))

    async def _wait_all(self, timeout: float) -> None:
        with trio.move_on_after(timeout):
            while self.live():
                await trio.sleep(0.1)
        for proc in self.live():
            log.error("worker pid %d did not stop in %.0fs: killed", proc.pid, timeout)
            proc.kill()

    # -------------------------------------------------------------- the upgrade

    async def upgrade(self, why: str) -> WorkersOutcome:
        """Every worker in turn hands over to a new process of the code on disk; then this
        process re-executes itself (``reexec_due``). UpgradeFailed says why not, and where it
        stopped."""

        if self.upgrading or self.reexec_due.is_set():
            raise UpgradeFailed("an upgrade is already under way", busy=True)
        if self.stopping:
            raise UpgradeFailed("the proxy is stopping", busy=True)
        self.upgrading = True
        started = trio.current_time()
        done: list[dict] = []
        try:
            with trio.move_on_after(START_TIMEOUT) as deadline:
                check = await trio.run_process([sys.executable, "-m", "proxy", "--config", self.path, "--check"],
                                               stdin=b"", capture_stdout=True, capture_stderr=True, check=False)  # fmt: skip
            if deadline.cancelled_caught:
                raise self._failed(f"the check of the new code ({sys.executable} -m proxy --check) took over {START_TIMEOUT:g}s", done)
            if check.returncode != 0:
                said = check.stderr.decode(errors="replace").strip().splitlines() or ["no reason given"]
                raise self._failed(f"the new code or config does not start: {said[-1]}", done)
            log.info("upgrade (%s): %s checks out; upgrading %d workers one after the other", why, self.path, self.count)
            for i in range(self.count):
                proc = self.procs[i]
                if proc is None or proc.poll() is not None:
                    raise self._failed(f"worker {i} is restarting", done)
                self.upgrading_worker = i
                status, answer = await trio.to_thread.run_sync(self._post, self.ports[i], "/upgrade", START_TIMEOUT + 20)
                if status == 0:  # no answer: the old worker may have exited as its answer left; who serves now?
                    answer = {**answer, **await trio.to_thread.run_sync(self._successor_of, i, proc)}
                    status = 200 if "new_pid" in answer else 0
                if status != 200:
                    raise self._failed(f"worker {i} (pid {proc.pid}): {answer.get('error') or f'HTTP {status}'}", done)
                self.procs[i] = WorkerProc(int(answer["new_pid"]))
                self.retiring.append(proc)
                done.append({"worker": i, **answer})
                log.info("upgrade: worker %d is pid %d now (was pid %d, which moves or drains its %d session(s))", i,
                         answer["new_pid"], proc.pid, answer["sessions_left_to_drain"], extra={"event": "upgrade_handed_over"})  # fmt: skip
        finally:
            self.upgrading = False
            self.upgrading_worker = None
        self.reexec_due.set()
        seconds = round(trio.current_time() - started, 3)
        log.info("upgrade: %d workers upgraded in %.3fs; the supervisor (pid %d) re-executes itself", self.count, seconds, os.getpid())
        listeners = sorted({entry for w in done for entry in w.get("listeners", [])})
        return WorkersOutcome(os.getpid(), os.getpid(), listeners, sum(w["sessions_left_to_drain"] for w in done), seconds, done)

    def _failed(self, reason: str, done: list[dict]) -> UpgradeFailed:
        if done:
            reason += f"; workers {', '.join(str(w['worker']) for w in done)} run the new code already, the rest the old"
            self.reexec_due.set()  # the supervisor too: it must not lag its workers
        log.error("upgrade failed, the supervisor (pid %d) serves on: %s", os.getpid(), reason, extra={"event": "upgrade_failed"})
        return UpgradeFailed(reason)

    async def _reexec_when_due(self) -> None:
        while True:
            await self.reexec_due.wait()
            await trio.sleep(_HANDOFF_GRACE)  # the answer to POST /upgrade leaves before this image does
            self.reexec()
            self.reexec_due = trio.Event()  # it failed (logged): the next upgrade tries again

    def reexec(self) -> None:
        """Replace this process's image with the code on disk; the workers and the admin
        listener carry over (the listener's descriptors stay open across exec)."""
        fds = [lst.socket.fileno() for lst in self.admin_listeners]
        state = {"procs": [p.pid if p is not None and p.poll() is None else 0 for p in self.procs],
                 "retiring": [p.pid for p in self.retiring if p.poll() is None], "ports": self.ports,
                 "restarts": self.restarts, "admin_fds": fds, "admin_address": str(self.config.admin_address)}  # fmt: skip
        for fd in fds:
            os.set_inheritable(fd, True)
        argv = [sys.executable, "-m", "proxy", "--config", self.path, "--workers", str(self.count)]
        try:
            os.execve(sys.executable, argv, {**os.environ, _INHERITANCE: json.dumps(state)})
        except OSError as exc:
            for fd in fds:
                os.set_inheritable(fd, False)
            log.error("the supervisor could not re-execute itself (%s): it serves on with its old code; its workers run the new", exc)

    def _successor_of(self, index: int, proc: WorkerProc) -> dict:
        """The outcome's fields for the process now on worker ``index``'s private port, if it is
        not ``proc`` (the hand-over happened, its answer was lost), else {}."""
        try:
            pid = int(get_json(f"http://127.0.0.1:{self.ports[index]}/healthz", timeout=3).get("pid") or 0)
        except (OSError, ValueError):
            return {}
        if pid in (0, proc.pid):
            return {}
        log.warning("upgrade: the answer of worker pid %d was lost; pid %d serves its port now", proc.pid, pid)
        return {"old_pid": proc.pid, "new_pid": pid, "sessions_left_to_drain": 0, "listeners": []}

    @staticmethod
    def _post(port: int, path: str, timeout: float) -> tuple[int, dict]:
        request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=b"", method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, json.load(response)
        except urllib.error.HTTPError as exc:
            try:
                return exc.code, json.load(exc)
            except ValueError:
                return exc.code, {}
        except (OSError, ValueError) as exc:
            return 0, {"error": f"no answer from its admin port {port}: {exc}"}

    # -------------------------------------------------------------- the gathering admin endpoint

    def gather(self, path: str) -> list[tuple[int, int, bytes]]:
        """(worker, status, body) of ``path`` on every live worker (during an upgrade, the new one:
        it answers on the private port from the moment it serves)."""
        out = []
        for i, port in enumerate(self.ports):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=3) as response:
                    out.append((i, response.status, response.read()))
            except urllib.error.HTTPError as exc:
                out.append((i, exc.code, exc.read()))
            except OSError:
                continue  # starting or restarting
        return out


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?( .*)$")


def merge_metrics(parts: list[tuple[int, bytes]]) -> bytes:
    """Prometheus text of every worker as one: samples labelled worker="i", HELP/TYPE once."""
    seen: set[str] = set()
    families: dict[str, list[str]] = {}
    order: list[str] = []
    for worker, body in parts:
        family = ""
        for line in body.decode().splitlines():
            if line.startswith("# "):
                words = line.split(" ", 3)
                family = words[2] if len(words) > 2 else ""
                if family not in families:
                    families[family] = []
                    order.append(family)
                if line not in seen:
                    seen.add(line)
                    families[family].append(line)
                continue
            m = _SAMPLE.match(line)
            if m is None:
                continue
            labels = f'worker="{worker}"' + (f",{m.group(3)}" if m.group(3) else "")
            families.setdefault(family, []).append(f"{m.group(1)}{{{labels}}}{m.group(4)}")
    return ("\n".join(line for f in order for line in families[f]) + "\n").encode()


def merge_status(parts: list[tuple[int, dict]]) -> dict:
    merged: dict = {"target": None, "ready": False, "workers": [], "backends": [], "sessions": [], "totals": {}}
    for worker, data in parts:
        merged["target"] = data["target"]
        merged["ready"] = merged["ready"] or data["ready"]
        merged["workers"].append({"worker": worker, "ready": data["ready"], "sessions": len(data["sessions"])})
        merged["backends"] = merged["backends"] or data["backends"]
        merged["sessions"] += [{**s, "worker": worker} for s in data["sessions"]]
        for key, value in data["totals"].items():
            if isinstance(value, dict):
                into = merged["totals"].setdefault(key, {})
                for k, v in value.items():
                    into[k] = into.get(k, 0) + v
            else:
                merged["totals"][key] = merged["totals"].get(key, 0) + value
    return merged


async def serve_gathering_admin(sup: Supervisor, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    from proxy import admin

    async def gather(path: str) -> list[tuple[int, int, bytes]]:
        return await trio.to_thread.run_sync(sup.gather, path)

    def healthz():
        alive = [i for i, p in enumerate(sup.procs) if p is not None and p.poll() is None]
        return admin.json_answer(200, {"status": "alive", "workers_alive": alive, "workers": sup.count, "restarts": sup.restarts,
                                       "pids": [p.pid if p is not None else None for p in sup.procs],
                                       "draining_pids": [p.pid for p in sup.retiring if p.poll() is None]})  # fmt: skip

    async def readyz():
        ready = any(status == 200 for _w, status, _b in await gather("/readyz"))
        return admin.json_answer(200 if ready else 503, {"ready": ready})

    async def metrics():
        return 200, admin.CONTENT_TYPE, merge_metrics([(w, b) for w, s, b in await gather("/metrics") if s == 200])

    async def status():
        return admin.json_answer(200, merge_status([(w, json.loads(b)) for w, s, b in await gather("/status") if s == 200]))

    table = {"/healthz": healthz, "/health": healthz, "/readyz": readyz, "/metrics": metrics, "/status": status,
             "/upgrade": admin.upgrade_route(sup, processes=sup.count)}  # fmt: skip
    address = sup.config.admin_address
    sup.admin_listeners = await admin.open_listeners(sup.config, address, sup.inherited_admin)
    await admin.serve_routes(sup.config, address, lambda: table, task_status=task_status, current_config=lambda: sup.config,
                             listeners=sup.admin_listeners)  # fmt: skip


def supervise(config: Config, path: str, count: int) -> int:
    sup = Supervisor(config, path, count)
    log.info("target %s: %d worker processes sharing %s", config.name, count, config.listen.address)
    try:
        trio.run(sup.run)
    except KeyboardInterrupt:
        sup.signal_all(signal.SIGTERM)
    return 0

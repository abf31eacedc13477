"""TiDB Data Migration (DM v8.5) on loopback, for the end-to-end bench and the config test.

    dm = DMCluster(tmp / "dm")
    dm.start()                                   # one dm-master, one dm-worker
    dm.create_source(source_yaml)                # operate-source create
    dm.ctl("start-task", str(task_yaml))         # any dmctl command, its JSON answer
    dm.pauses()                                  # "paused" lines of dm-worker's log so far

    DMCluster(tmp / "dm", workers=2, sidecars=["127.0.0.11", "127.0.0.12"])
                                                 # two dm-workers, each dialing its own sidecar

Several dm-workers each with a sidecar of its own, as Kubernetes deploys them (each pod dials
``127.0.0.1:4000``, its own proxy): every worker reaches the task's ``target-database`` host
``SIDECAR_HOST`` at an address of its own (``sidecars[i]``, a loopback address the worker's proxy
listens on, all on one port). Each dm-worker runs in a mount namespace of its own
(``unshare --mount``) whose /etc/hosts names that address; dm-master (``check-task``, the task's
pre-checks) sees the first one. Needs root; ``sidecar_unavailable_reason`` says when it cannot.

The binaries are not built here (DM needs TiDB's module, which the Go module proxy does not
serve): ``$REPLAY_PROXY_DM_BIN`` (a folder with dm-master, dm-worker, dm-ctl), then
``~/.cache/replay-proxy/bin``, then PATH. README says how to bring them (tiup or a release).

A pause of a subtask, however short, is a ``"paused"`` line in dm-worker's log (an
auto-resume within a second never shows in ``query-status``); ``dispatch auto resume task``
is a resume; ``unit process error`` lines carry why.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.lab import binaries
from tests.lab.mariadb import HOST, free_port
from tests.lab.procs import kill_at_exit, read_log, terminate, wait_listening

ENV_BIN = "REPLAY_PROXY_DM_BIN"
PROGRAMS = ("dm-master", "dm-worker", "dm-ctl")
SIDECAR_HOST = "dm-sidecar"  # what a task's target-database names when each worker has its own proxy


def dm_program(name: str) -> str | None:
    return binaries.find(name, ENV_BIN, folder=True)


def dm_unavailable_reason() -> str | None:
    return binaries.missing_reason(PROGRAMS, ENV_BIN, folder=True)


def dm_missing_in(folder: Path) -> str | None:
    """None when ``folder`` holds every DM program, else the one line that says which not."""
    missing = [name for name in PROGRAMS if not os.access(Path(folder) / name, os.X_OK)]
    return f"no {', '.join(missing)} in {folder}" if missing else None


def sidecar_unavailable_reason() -> str | None:
    """None when a process can get /etc/hosts of its own (``unshare --mount``, root), else the
    one line a skipped suite shows."""
    try:
        res = subprocess.run(_own_hosts(Path("/etc/hosts"), ["true"]), capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"no mount namespace of its own for each dm-worker (unshare --mount): {exc}"
    if res.returncode != 0:
        return f"no mount namespace of its own for each dm-worker (unshare --mount, needs root): {res.stderr.strip()[:200]}"
    return None


def _own_hosts(hosts: Path, command: list[str]) -> list[str]:
    """``command`` in a mount namespace of its own where ``hosts`` is /etc/hosts (the same pid:
    unshare and sh exec it)."""
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", 'mount --bind "$0" /etc/hosts && exec "$@"', str(hosts),
            *command]  # fmt: skip


class DMError(RuntimeError):
    pass


@dataclass
class LogEvent:
    at: float  # seconds since the epoch, from the log line's timestamp
    message: str
    fields: str  # the rest of the line: error texts, unit...


# [2026/12/01 10:21:40.123 +00:00] [INFO] [subtask.go:360] ["paused"] [task=x] [unit=Sync]
_LINE = re.compile(r"^\[(\d{4}/\d\d/\d\d \d\d:\d\d:\d\d\.\d+) ([+-]\d\d:\d\d)\] \[(\w+)\] \[[^\]]*\] \[\"?(.*?)\"?\](.*)$")


def parse_log(text: str, messages: tuple[str, ...]) -> list[LogEvent]:
    """The lines of a DM log whose message is one of ``messages``."""
    out = []
    for line in text.splitlines():
        m = _LINE.match(line)
        if m is None or m.group(4) not in messages:
            continue
        stamp = time.strptime(m.group(1).split(".")[0], "%Y/%m/%d %H:%M:%S")
        sign = 1 if m.group(2)[0] == "+" else -1
        hours, minutes = int(m.group(2)[1:3]), int(m.group(2)[4:6])
        at = _timegm(stamp) + float("0." + m.group(1).split(".")[1]) - sign * (hours * 3600 + minutes * 60)
        out.append(LogEvent(at, m.group(4), m.group(5)))
    return out


def _timegm(stamp: time.struct_time) -> float:
    import calendar

    return float(calendar.timegm(stamp))


class DMCluster:
    """One dm-master and ``workers`` dm-workers on loopback ports, in ``basedir``; their programs
    from ``bin_dir`` when given (a DM build of its own, e.g. one with a patch), else as above;
    with ``sidecars`` (an address per worker), worker i reaches ``SIDECAR_HOST`` at ``sidecars[i]``."""

    def __init__(self, basedir: Path, bin_dir: Path | None = None, workers: int = 1, sidecars: list[str] | None = None) -> None:
        self.bin_dir = bin_dir
        reason = (dm_unavailable_reason() if bin_dir is None else dm_missing_in(bin_dir)) or (
            sidecar_unavailable_reason() if sidecars else None
        )
        if reason is not None:
            raise DMError(reason)
        if sidecars is not None and len(sidecars) != workers:
            raise ValueError(f"{workers} workers, {len(sidecars)} sidecar addresses: one each")
        self.basedir = Path(basedir).resolve()
        self.basedir.mkdir(parents=True, exist_ok=True)
        self.master_port, self.peer_port = free_port(), free_port()
        self.master_addr = f"{HOST}:{self.master_port}"
        self.master_log = self.basedir / "dm-master.log"
        self.workers = [f"worker{i + 1}" for i in range(workers)]
        self.worker_ports = [free_port() for _ in self.workers]
        self.worker_port = self.worker_ports[0]
        # worker1's files keep the one-worker names (dm-worker.log, relay/)
        self.worker_logs = [self.basedir / ("dm-worker.log" if i == 0 else f"dm-{name}.log") for i, name in enumerate(self.workers)]
        self.worker_log = self.worker_logs[0]
        self.sidecars = sidecars
        self._procs: list[subprocess.Popen] = []

    def start(self, timeout: float = 60) -> None:
        master_conf = self.basedir / "dm-master.toml"
        master_conf.write_text(
            f'name = "master"\nmaster-addr = "{self.master_addr}"\nadvertise-addr = "{self.master_addr}"\n'
            f'peer-urls = "http://{HOST}:{self.peer_port}"\nadvertise-peer-urls = "http://{HOST}:{self.peer_port}"\n'
            f'initial-cluster = "master=http://{HOST}:{self.peer_port}"\ndata-dir = "{self.basedir / "master-data"}"\n'
            f'log-file = "{self.master_log}"\nlog-level = "info"\nauto-compaction-retention = "3s"\n'
        )  # fmt: skip
        self._spawn("dm-master", master_conf, self.master_port, timeout, "dm-master", 0)
        self._wait(lambda: self.ctl("list-member", "--master").get("result"), timeout, "dm-master to lead")
        for i, (name, port, log) in enumerate(zip(self.workers, self.worker_ports, self.worker_logs)):
            stem = "dm-worker" if i == 0 else f"dm-{name}"
            worker_conf = self.basedir / f"{stem}.toml"
            worker_conf.write_text(
                f'name = "{name}"\nworker-addr = "{HOST}:{port}"\nadvertise-addr = "{HOST}:{port}"\n'
                f'join = "{self.master_addr}"\nlog-file = "{log}"\nlog-level = "info"\n'
                f'relay-dir = "{self.basedir / ("relay" if i == 0 else f"relay-{name}")}"\n'
            )  # fmt: skip
            self._spawn("dm-worker", worker_conf, port, timeout, stem, i)
        self._wait(self._workers_registered, timeout, "the dm-workers to register")

    def _spawn(self, program: str, config: Path, port: int, timeout: float, stem: str, sidecar: int) -> None:
        """Start ``program``, its output in ``<stem>.out``; with sidecars, seeing
        ``sidecars[sidecar]`` as ``SIDECAR_HOST``."""
        command = [self.program(program), f"--config={config}"]
        if self.sidecars:
            hosts = self.basedir / f"{stem}.hosts"
            hosts.write_text(Path("/etc/hosts").read_text() + f"\n{self.sidecars[sidecar]} {SIDECAR_HOST}\n")
            command = _own_hosts(hosts, command)
        out = open(self.basedir / f"{stem}.out", "ab")
        proc = subprocess.Popen(command, cwd=self.basedir, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        out.close()
        kill_at_exit(proc)
        self._procs.append(proc)
        wait_listening(proc, port, timeout, program, lambda: read_log(self.basedir / f"{stem}.out"))

    def program(self, name: str) -> str | None:
        return str(self.bin_dir / name) if self.bin_dir is not None else dm_program(name)

    def _workers_registered(self) -> bool:
        members = self.ctl("list-member", "--worker")
        names = {w.get("name") for m in members.get("members", []) for w in m.get("worker", {}).get("workers", [])}
        return set(self.workers) <= names

    @staticmethod
    def _wait(predicate, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if predicate():
                    return
            except DMError:
                pass
            if time.monotonic() > deadline:
                raise DMError(f"timed out after {timeout} s waiting for {what}")
            time.sleep(0.5)

    def ctl(self, *args: str, timeout: float = 120) -> dict[str, Any]:
        """Run ``dmctl --master-addr ... <args>``; its JSON answer."""
        cmd = [self.program("dm-ctl"), f"--master-addr={self.master_addr}", *args]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        text = res.stdout.strip()
        start = text.find("{")
        if start < 0:
            raise DMError(f"dmctl {' '.join(args)}: no JSON answer (exit {res.returncode}): {text[-500:]} {res.stderr[-500:]}")
        try:
            return json.loads(text[start:], strict=False)
        except ValueError:
            pass
        # check-task prints {"result": ..., "msg": "<a JSON document, quotes unescaped>"}.
        nested = re.fullmatch(r'\{\s*"result":\s*(true|false),\s*"msg":\s*"(.*)"\s*\}', text[start:], re.DOTALL)
        if nested is None:
            raise DMError(f"dmctl {' '.join(args)}: unreadable answer: {text[-500:]}")
        try:
            msg: Any = json.loads(nested.group(2), strict=False)
        except ValueError:
            msg = nested.group(2)
        return {"result": nested.group(1) == "true", "msg": msg}

    def create_source(self, source_yaml: Path) -> dict[str, Any]:
        answer = self.ctl("operate-source", "create", str(source_yaml))
        if not answer.get("result"):
            raise DMError(f"operate-source create failed: {json.dumps(answer)[:2000]}")
        return answer

    def start_task(self, task_yaml: Path) -> dict[str, Any]:
        answer = self.ctl("start-task", str(task_yaml))
        if not answer.get("result"):
            raise DMError(f"start-task failed: {json.dumps(answer)[:2000]}")
        return answer

    def worker_log_text(self) -> str:
        """Every dm-worker's log, one after the other."""
        return "\n".join(read_log(log) for log in self.worker_logs)

    def events(self, *messages: str) -> list[LogEvent]:
        return parse_log(self.worker_log_text(), messages)

    def pauses(self) -> list[LogEvent]:
        return self.events("paused")

    def stop(self) -> None:
        for proc in reversed(self._procs):
            terminate(proc, 20)
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self._procs.clear()

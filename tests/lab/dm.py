"""TiDB Data Migration (DM v8.5) on loopback, for the end-to-end bench and the config test.

    dm = DMCluster(tmp / "dm")
    dm.start()                                   # one dm-master, one dm-worker
    dm.create_source(source_yaml)                # operate-source create
    dm.ctl("start-task", str(task_yaml))         # any dmctl command, its JSON answer
    dm.pauses()                                  # "paused" lines of dm-worker's log so far

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


def dm_program(name: str) -> str | None:
    return binaries.find(name, ENV_BIN, folder=True)


def dm_unavailable_reason() -> str | None:
    return binaries.missing_reason(PROGRAMS, ENV_BIN, folder=True)


def dm_missing_in(folder: Path) -> str | None:
    """None when ``folder`` holds every DM program, else the one line that says which not."""
    missing = [name for name in PROGRAMS if not os.access(Path(folder) / name, os.X_OK)]
    return f"no {', '.join(missing)} in {folder}" if missing else None


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
    """One dm-master and one dm-worker on loopback ports, in ``basedir``; their programs from
    ``bin_dir`` when given (a DM build of its own, e.g. one with a patch), else as above."""

    def __init__(self, basedir: Path, bin_dir: Path | None = None) -> None:
        self.bin_dir = bin_dir
        reason = dm_unavailable_reason() if bin_dir is None else dm_missing_in(bin_dir)
        if reason is not None:
            raise DMError(reason)
        self.basedir = Path(basedir).resolve()
        self.basedir.mkdir(parents=True, exist_ok=True)
        self.master_port, self.peer_port, self.worker_port = free_port(), free_port(), free_port()
        self.master_addr = f"{HOST}:{self.master_port}"
        self.master_log = self.basedir / "dm-master.log"
        self.worker_log = self.basedir / "dm-worker.log"
        self._procs: list[subprocess.Popen] = []

    def start(self, timeout: float = 60) -> None:
        master_conf = self.basedir / "dm-master.toml"
        master_conf.write_text(
            f'name = "master"\nmaster-addr = "{self.master_addr}"\nadvertise-addr = "{self.master_addr}"\n'
            f'peer-urls = "http://{HOST}:{self.peer_port}"\nadvertise-peer-urls = "http://{HOST}:{self.peer_port}"\n'
            f'initial-cluster = "master=http://{HOST}:{self.peer_port}"\ndata-dir = "{self.basedir / "master-data"}"\n'
            f'log-file = "{self.master_log}"\nlog-level = "info"\nauto-compaction-retention = "3s"\n'
        )  # fmt: skip
        worker_conf = self.basedir / "dm-worker.toml"
        worker_conf.write_text(
            f'name = "worker1"\nworker-addr = "{HOST}:{self.worker_port}"\nadvertise-addr = "{HOST}:{self.worker_port}"\n'
            f'join = "{self.master_addr}"\nlog-file = "{self.worker_log}"\nlog-level = "info"\n'
            f'relay-dir = "{self.basedir / "relay"}"\n'
        )  # fmt: skip
        self._spawn("dm-master", master_conf, self.master_port, timeout)
        self._wait(lambda: self.ctl("list-member", "--master").get("result"), timeout, "dm-master to lead")
        self._spawn("dm-worker", worker_conf, self.worker_port, timeout)
        self._wait(self._worker_registered, timeout, "dm-worker to register")

    def _spawn(self, program: str, config: Path, port: int, timeout: float) -> None:
        out = open(self.basedir / f"{program}.out", "ab")
        proc = subprocess.Popen([self.program(program), f"--config={config}"], cwd=self.basedir, stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        out.close()
        kill_at_exit(proc)
        self._procs.append(proc)
        wait_listening(proc, port, timeout, program, lambda: read_log(self.basedir / f"{program}.out"))

    def program(self, name: str) -> str | None:
        return str(self.bin_dir / name) if self.bin_dir is not None else dm_program(name)

    def _worker_registered(self) -> bool:
        members = self.ctl("list-member", "--worker")
        return any(w.get("name") == "worker1" for m in members.get("members", []) for w in m.get("worker", {}).get("workers", []))

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

    def worker_log_text(self) -> str:
        return read_log(self.worker_log)

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

"""The seed's story with the real parts: DM v8.5 replicating into TiDB while TiDB restarts.

    python -m bench.dm_e2e [--duration 300] [--interval 8] [--restarts N] [--chaos-from start|sync]
                           [--graceful-waits 0,3] [--targets direct,proxy]
    python -m bench.dm_e2e --cluster [--servers 3] [--faults rolling|kill|moving] [--graceful-wait 3]
                           [--targets haproxy,tiproxy,proxy] [--restarts N] [--interval 8] [--discovery dns|pd]
    python -m bench.dm_e2e --cluster --no-faults [--backlog 60]      # DM's replication rate per middle
    python -m bench.dm_e2e --no-faults --pin-tidb 0 [--backlog 90]   # the same, tidb-server on its own CPU
    python -m bench.dm_e2e --chaos proxy-upgrade|proxy-restart [--chaos-interval 8] [--faults rolling]
    python -m bench.dm_e2e --soak 1800 [--interval 8] [--seed 7]      # every fault, in random order
    python -m bench.dm_e2e --dm-bin v8.5.5=DIR --dm-bin fix=DIR [--safe-mode off,on]
                           [--targets direct,proxy,fix:haproxy]          # DM builds side by side

For each target a fresh lab: an upstream MariaDB with a row binlog (utf8mb4), a preloaded shop
schema, the downstream, one dm-master and one dm-worker on loopback, a source and a ``task-mode:
all`` task (16 DML workers, batches of 100) whose target is the middle (bench/dm_middles.py):
``direct`` (DM writes to tidb-server), ``proxy`` (replay-proxy as configs/dm-sidecar.toml
configures it), ``haproxy`` (TCP, health checks on the status ports, as PingCAP deploys it),
``tiproxy`` (TiProxy, which moves sessions off a draining server; --cluster only).

Which DM: ``--dm-bin [LABEL=]DIR`` (repeated, or a comma list), each a folder of dm-master,
dm-worker and dm-ctl; every target runs with every build in turn, a target written
``LABEL:target`` with that build only (bench/dm_builds.py). Each run says its DM as the build
says of itself: the version of ``dm-worker -V`` and ``+#12078`` when its dm-worker carries the
seed's fix (tiflow PR #12078). ``--safe-mode on`` sets the task's ``syncers.safe-mode: true``
(``off``: DM's default, safe mode only for a while after a start or resume; ``off,on``: each
run with both).

The downstream: one tidb-server (unistore), or with ``--cluster`` a TiDB cluster
(tests/lab/cluster.py: PD, one store process, ``--servers`` tidb-servers sharing the data,
the middle in front of every server; ``direct`` is the first server).

A load writes upstream (bench/dm_load.py) from the moment the task starts. The faults, exactly
``--restarts`` of them (default duration / interval), the same schedule for every target:

- one server: TiDB restarts (SIGTERM, ``graceful-wait-before-shutdown`` taking the
  ``--graceful-waits`` values in turn), ``--interval`` seconds from one's end to the next;
- a cluster, ``--faults rolling``: a rolling restart as ``tiup cluster reload`` does it, one
  tidb-server at a time (SIGTERM; every server waits ``--graceful-wait`` seconds before it
  shuts down; the next event once it serves again), each event the next server in turn, an
  event every ``--interval`` seconds start to start (an event takes at least the graceful
  wait: a longer one delays the next); ``--faults kill``: the same with SIGKILL (a crash, the
  server started again at once); ``--faults moving``: the rolling restart as TiDB Operator
  does it, each server back on a new address (127.0.0.2, 127.0.0.3, ... sharing one port:
  bench/dm_discovery.py), the proxy finding the servers as ``--discovery`` says (``dns``: a
  headless Service's name, served by dnsmasq; ``pd``: PD's list; TiProxy always asks PD);
- ``--no-faults`` (``--faults none``): no restart; instead, once DM's sync unit runs, the task
  is paused for ``--backlog`` seconds while the load goes on and resumed: how fast DM drains
  the backlog through each middle is its replication rate (upstream transactions and
  statements applied per second: written upstream before the heartbeat DM has applied, read
  downstream every second); the full load's rate is the downstream row count over time during
  the Load unit (rows/s). Run it with a --duration long enough for the drain (the load stops
  at --duration; the final catch-up then ends the drain). ``--pin-tidb CPUS`` (one server):
  tidb-server on those CPUs, every other process on the rest, as in a deployment, where the
  sidecar shares DM's pod and TiDB has its own nodes; without it, whatever the middle spends
  is CPU the saturated tidb-server does not get. While DM drains, /proc says where the CPU
  went: the machine's busy cores and each command's (tidb-server, dm-worker, the middle).

The proxy's own faults (``--chaos``, target ``proxy`` only; TiDB is not restarted unless
``--faults`` says so, then both run at once): every ``--chaos-interval`` seconds start to start,
``proxy-upgrade`` (SIGUSR2: the sessions move to a new process with their connections; the
event ends once the old process has exited) or ``proxy-restart`` (SIGTERM, the sessions drain,
then the same config started again: ``systemctl restart``). Each is logged with the sessions
moved and drained.

``--soak SECONDS``: one tidb-server behind the fault shim (tests/lab/faultshim.py), which DM
or the middle connects to (the bench reads the server directly), a DDL every 10 s upstream,
and a fault ``--interval`` seconds after the last one ended, for SECONDS, in random order
(``--seed``): a graceful restart (the next start's graceful wait 0 or 3 s), the SQL layer
crashing (every connection cut, connects refused 1 s), a partition of the shim's port for
5-90 s (netfilter: every packet dropped), the answer of DM's next DDL lost, the idle sessions
closed by the server. The same seed gives every target the same order.

With ``--chaos-from start`` the faults begin at the task's start (they hit the full load, then
the sync), with ``--chaos-from sync`` only once DM's task runs its sync unit (``dmctl
query-status``: unit Sync, stage Running; the dump and the full load are done), so the sync
phase has a baseline of its own. The load runs at least ``--duration`` seconds and until the
last fault is an interval old. Then the load stops, DM catches up, and every table is compared
upstream and downstream (on any running server: row count and a NULL-safe checksum of every
row and column, bench/dm_load.py, the same SQL on both).

Counted from dm-worker's log, per phase (full load / sync): pauses (``"paused"``; one
auto-resumed within a second never shows in ``query-status``; --no-faults' own pause is left
out), the time paused, resumes, the failed transactions as DM sees them (sync: a batch try that
failed -- ``execute sql failed by connection error`` / ``by retryable error``, retried in place,
or ``execute statements failed after retry``, given up; full load: ``execute statement
failed``, a chunk's statement) and of them those whose error is ``Error 1158``, the errors the
pauses report by kind (``unit process error``), and apart from those the raw ERROR lines. Lag: the upstream heartbeat row read downstream
every second (on any server that answers). The middles' own numbers (bench/dm_middles.py): the
proxy's recoveries by outcome and 1158 refusals (/metrics) and sessions moved (its log);
TiProxy's session migrations (/metrics) and its log's lines about them; HAProxy's servers marked
down and up. Results in bench/results/<timestamp>-dm_e2e/: table.txt (a column a run),
summary.md (a row a run: DM, middle, safe mode, pauses, time paused, failed transactions,
1158s, max lag, tables identical), results.json (with every run's DM build, and every restart:
which server, signal, when stopped, down, serving again, graceful wait), lag.png (lag over
time, restarts marked: SIGTERM shaded, SIGKILL red lines).

Needs the DM and tidb-server binaries (tests/lab/dm.py, tests/lab/tidb.py say where from);
--cluster also pd-server and unistore-server (tests/lab/cluster.py), tiproxy for its target.
"""

from __future__ import annotations

import argparse
import bisect
import datetime as _dt
import json
import os as _os
import random
import re
import shutil
import signal as _signal
import socket
import statistics
import sys
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pymysql

from bench import REPO, dm_builds, dm_discovery, dm_load, hops, procstat
from bench.dm_middles import LABELS, MIDDLES, middle_numbers, start_middle
from bench.hygiene import sigterm_as_interrupt
from bench.runinfo import run_meta
from tests.lab.cluster import Cluster, cluster_unavailable_reason
from tests.lab.discovery import Endpoints
from tests.lab.dm import DMCluster, dm_unavailable_reason
from tests.lab.faultshim import FaultShim
from tests.lab.mariadb import MariaDB
from tests.lab.netfault import Partition
from tests.lab.procs import wait_for
from tests.lab.proxy import ProxyProcess
from tests.lab.tidb import TiDB, tidb_unavailable_reason
from tests.lab.tiproxy import tiproxy_unavailable_reason
from tests.lab.upgrades import Upgraded

UPSTREAM_ARGS = ["--log-bin=binlog", "--binlog-format=ROW", "--binlog-row-image=FULL", "--server-id=1",
                 "--character-set-server=utf8mb4", "--collation-server=utf8mb4_general_ci"]  # fmt: skip
DM_USER, DM_PASSWORD = "dm", "dm-secret"
SOURCE_ID = "mysql-replica-01"  # configs/deploy/dm/task.yaml's
TASK = "shop"
SIGNALS = {"rolling": _signal.SIGTERM, "kill": _signal.SIGKILL}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.dm_e2e", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--duration", type=float, default=300, help="seconds of load and restarts per target (default 300)")
    p.add_argument("--interval", type=float, default=8,
                   help="seconds from one restart to the next (default 8; one server: end to start; a cluster: start to start)")  # fmt: skip
    p.add_argument("--restarts", type=int, help="TiDB restarts per target, the same for each (default duration / interval)")
    p.add_argument("--chaos-from", choices=("start", "sync"), default="start",
                   help="start: restarts from start-task on (full load, then sync); sync: only once DM's sync unit runs")  # fmt: skip
    p.add_argument("--sync-timeout", type=float, default=900, help="--chaos-from sync: seconds to wait for the sync unit (default 900)")
    p.add_argument("--graceful-waits", default="0,3", help="one server: graceful-wait-before-shutdown values, in turn (default 0,3)")
    p.add_argument("--cluster", action="store_true", help="downstream: a TiDB cluster (PD, the store, --servers tidb-servers)")
    p.add_argument("--servers", type=int, default=3, help="--cluster: tidb-servers (default 3)")
    p.add_argument("--discovery", choices=dm_discovery.MODES, default="static",
                   help="--cluster: how the proxy finds the tidb-servers (backend.discovery): static (their addresses, "
                        "default), dns (a headless Service's name), pd (PD's list); the servers then each on an address "
                        "of their own (bench/dm_discovery.py)")  # fmt: skip
    p.add_argument("--faults", choices=("rolling", "kill", "moving", "none", "off"),
                   help="rolling: SIGTERM one server at a time (default); kill: SIGKILL one at a time (--cluster); moving: "
                        "rolling, each server back on a new address (--cluster); none: no faults, "
                        "DM's replication rate (= --no-faults); off: TiDB is not restarted (the default with --chaos)")  # fmt: skip
    p.add_argument("--chaos", choices=("proxy-upgrade", "proxy-restart", "worker-kill"),
                   help="the proxy's own faults, every --chaos-interval s: proxy-upgrade (SIGUSR2: sessions move to a new "
                        "process), proxy-restart (SIGTERM, then started again, as systemctl restart), worker-kill (SIGKILL of "
                        "one worker in turn; --proxy-workers 2 or more); target proxy only")  # fmt: skip
    p.add_argument("--proxy-workers", type=int, default=1, metavar="N",
                   help="the proxy runs N worker processes (listen.workers); --chaos proxy-upgrade then upgrades through "
                        "the supervisor, every worker in turn (default 1)")  # fmt: skip
    p.add_argument("--chaos-interval", type=float, default=8,
                   help="--chaos: seconds from one of the proxy's faults to the next (default 8)")  # fmt: skip
    p.add_argument("--soak", type=float, metavar="SECONDS",
                   help="every fault at once, for SECONDS (e.g. 1800): one tidb-server behind the fault shim, a DDL every 10 s, "
                        "and in random order graceful restarts (wait 0 and 3 s), SQL-layer crashes, partitions of 5-90 s, lost DDL "
                        "answers, idle sessions closed; one fault --interval s after the last one ended")  # fmt: skip
    p.add_argument("--seed", type=int, default=7, help="--soak: the fault order's random seed (default 7)")
    p.add_argument("--buffer-window", type=float, default=30.0, metavar="SECONDS",
                   help="the proxy's recovery.buffer_window (default 30, configs/dm-sidecar.toml's); a fault longer "
                   "than it reaches DM as 1158")  # fmt: skip
    p.add_argument("--no-faults", action="store_true", help="no restart: DM's full-load rate and backlog catch-up rate per middle")
    p.add_argument("--graceful-wait", type=int, default=3,
                   help="--cluster: every tidb-server's graceful-wait-before-shutdown, seconds (default 3; e.g. 0, 3, 15)")  # fmt: skip
    p.add_argument("--backlog", type=float, default=60, help="--no-faults: seconds DM's task stays paused once in sync (default 60)")
    p.add_argument("--capture-hops", type=float, metavar="SECONDS",
                   help="--no-faults, one server: capture lo this long from 6 s after the resume, for each "
                        "round trip's hops through the middle (bench/hops.py; needs root)")  # fmt: skip
    p.add_argument("--pin-tidb", metavar="CPUS",
                   help="--no-faults, one server: tidb-server on these CPUs (e.g. 0), everything else (DM, the middle, "
                        "MariaDB, the load, the bench) on the others, as deployed: the sidecar shares DM's pod, not "
                        "TiDB's node (default: every process on every CPU)")  # fmt: skip
    p.add_argument("--targets", help=f"some of {','.join(MIDDLES)} (default direct,proxy; --cluster: haproxy,tiproxy,proxy); "
                   "LABEL:target runs that target with the --dm-bin build LABEL only, a plain one with every build")  # fmt: skip
    p.add_argument("--dm-bin", action="append", default=[], metavar="[LABEL=]DIR",
                   help="a DM build to run: a folder with dm-master, dm-worker and dm-ctl (repeat it, or a comma list, to "
                        "compare builds in one command; default: tests/lab/dm.py's DM). Each run says the build's version "
                        "(dm-worker -V) and whether it carries tiflow PR #12078")  # fmt: skip
    p.add_argument("--safe-mode", default="off", metavar="off|on|off,on",
                   help="syncers.safe-mode of the task: off (DM's default), on, or both (each its own runs)")  # fmt: skip
    p.add_argument("--scale", type=int, default=60000, help="orders preloaded upstream (default 60000: ~45 MB)")
    p.add_argument("--rate", type=float, default=140, help="upstream transactions per second (default 140)")
    p.add_argument("--catch-up", type=float, default=600, help="seconds DM may take to catch up at the end")
    p.add_argument("--general-log", action="store_true", help="turn on TiDB's general log (the SQL corpus)")
    p.add_argument("--out", type=Path, help="results folder (default bench/results/<timestamp>-dm_e2e)")
    p.add_argument("--keep-data", action="store_true",
                   help="keep the databases' data, the dump and DM's relay log in the results folder (GBs; default: logs only)")  # fmt: skip
    args = p.parse_args(argv)
    if args.soak:
        if args.cluster or args.chaos or args.no_faults or args.faults:
            p.error("--soak runs its own faults on one tidb-server: not with --cluster, --chaos, --faults or --no-faults")
        args.duration, args.faults = args.soak, "soak"
    if args.no_faults:
        args.faults = "none"
    if args.faults is None:
        args.faults = "off" if args.chaos else "rolling"
    args.chaos_events = int(args.duration // args.chaos_interval) if args.chaos else 0
    try:
        args.safe_modes = dm_builds.parse_safe_modes(args.safe_mode)
        dm_builds.parse_dm_bins(args.dm_bin)
    except ValueError as exc:
        p.error(str(exc))
    if args.chaos and any(middle_of(t) != "proxy" for t in (args.targets or "proxy").split(",")):
        p.error("--chaos restarts or upgrades the proxy: --targets proxy only")
    if args.chaos and args.faults == "none":
        p.error("--chaos measures faults: not with --no-faults")
    if args.chaos == "worker-kill" and args.proxy_workers < 2:
        p.error("--chaos worker-kill kills one worker while the others serve: --proxy-workers 2 or more")
    args.graceful_waits = [int(x) for x in args.graceful_waits.split(",")]
    if args.capture_hops is not None and (args.cluster or args.faults != "none"):
        p.error("--capture-hops: with --no-faults on one tidb-server")
    if args.pin_tidb is not None:
        if args.cluster or args.faults != "none":
            p.error("--pin-tidb: with --no-faults on one tidb-server (a restarted server would not be pinned again)")
        try:
            args.tidb_cpus = {int(c) for c in args.pin_tidb.split(",")}
        except ValueError:
            p.error(f"--pin-tidb {args.pin_tidb!r}: CPU numbers, comma-separated")
        if not args.tidb_cpus < _os.sched_getaffinity(0):
            p.error(f"--pin-tidb {args.pin_tidb}: leaves no CPU of {sorted(_os.sched_getaffinity(0))} for the rest, or names one not there")
    default_targets = "proxy" if args.chaos else "haproxy,tiproxy,proxy" if args.cluster else "direct,proxy"
    args.targets = [t.strip() for t in (args.targets or default_targets).split(",") if t.strip()]
    unknown = [t for t in args.targets if middle_of(t) not in MIDDLES]
    if unknown:
        p.error(f"unknown target(s) {', '.join(unknown)}: one of {', '.join(MIDDLES)}")
    if "tiproxy" in middles(args) and not args.cluster:
        p.error("the tiproxy target needs --cluster (TiProxy finds the tidb-servers through PD)")
    if args.faults == "kill" and not args.cluster:
        p.error("--faults kill needs --cluster: a single tidb-server's in-process unistore loses acknowledged writes on SIGKILL")
    if args.cluster and args.servers < 2:
        p.error("--servers: a cluster here has at least 2 tidb-servers")
    if dm_discovery.problem(args):
        p.error(dm_discovery.problem(args))
    if args.cluster and args.faults in ("rolling", "moving") and args.interval < args.graceful_wait:
        p.error(f"--interval {args.interval:g} is shorter than --graceful-wait {args.graceful_wait}: an event takes at least that")
    if args.faults in ("none", "off"):
        args.restarts = 0
    elif args.faults == "soak":
        args.restarts = None  # faults until --soak seconds have passed (the Restarter's count: none)
    elif args.restarts is None:
        args.restarts = max(1, int(args.duration // args.interval))
    return args


def middle_of(target: str) -> str:
    """The middle of a --targets entry (``LABEL:target`` or ``target``)."""
    return target.rpartition(":")[2].strip()


def middles(args: argparse.Namespace) -> set[str]:
    return {middle_of(t) for t in args.targets}


class Restarter(threading.Thread):
    """``count`` faults (None: until ``stop_event``), ``event(n)`` each (n from 1; it returns the restart's record), every
    ``interval`` seconds: from one's end to the next's start, or with ``start_to_start`` from
    one's start to the next's (an event that overruns delays the next); with ``ready``, only
    once ``ready()`` says so (checked every second)."""

    def __init__(self, event: Callable[[int], dict[str, Any]], interval: float, log, count: int | None, ready=None,
                 start_to_start: bool = False) -> None:  # fmt: skip
        super().__init__(daemon=True, name="restarter")
        self.event, self.interval, self.log, self.count, self.ready = event, interval, log, count, ready
        self.start_to_start = start_to_start
        self.stop_event = threading.Event()
        self.restarts: list[dict[str, Any]] = []
        self.began: float | None = None  # when the schedule started (None: ``ready`` never said so)

    def run(self) -> None:
        while self.ready is not None and not self.ready():
            if self.stop_event.wait(1.0):
                return
        self.began = time.time()
        if self.ready is not None:
            self.log("  DM's sync unit is running: restarts begin")
        n, due = 0, time.monotonic() + self.interval
        while self.count is None or n < self.count:
            delay = max(0.0, due - time.monotonic()) if self.start_to_start else self.interval
            if self.stop_event.wait(delay):
                return
            due = time.monotonic() + self.interval
            n += 1
            record = self.event(n)
            self.restarts.append(record)
            if "error" in record:
                self.log(f"  restart {n}{'' if self.count is None else f'/{self.count}'}: {record['server']} {record['signal']}: "
                         f"{record['error'][:300]}")  # fmt: skip
                if record.get("up") is None:
                    self.log("  the server did not come back: no more restarts")
                    return
                continue
            if "summary" in record:
                self.log(f"  {record['server']} {n}{'' if self.count is None else f'/{self.count}'}: {record['summary']}")
                continue
            self.log(f"  restart {n}/{self.count}: {record['server']} {record['signal']}, graceful wait {record['graceful_wait']} s, "
                     f"down {record['down'] - record['stop']:.1f} s after the signal, serving {record['up'] - record['down']:.1f} s later")  # fmt: skip


def single_server_event(tidb: TiDB, waits: list[int]) -> Callable[[int], dict[str, Any]]:
    """One server's restart: SIGTERM, then start with the next graceful wait of ``waits``."""

    def event(n: int) -> dict[str, Any]:
        wait = tidb.graceful_wait
        began = time.time()
        tidb.stop()
        down = time.time()
        tidb.graceful_wait = waits[n % len(waits)]  # read by the next start
        tidb.start()
        return {"server": "tidb", "index": 0, "signal": "SIGTERM", "stop": began, "down": down, "up": time.time(), "graceful_wait": wait}

    return event


def cluster_event(cluster: Cluster, sig: int, endpoints: Endpoints | None = None) -> Callable[[int], dict[str, Any]]:
    """Event n: tidb-server (n - 1) mod N stopped with ``sig`` and started again, serving before
    the event ends (one step of a rolling restart, or a crash); with ``endpoints``, started on a
    new address (``Endpoints.move``: a pod's replacement)."""

    def event(n: int) -> dict[str, Any]:
        index = (n - 1) % len(cluster.servers)
        server = cluster.servers[index]
        record: dict[str, Any] = {"server": server.basedir.name, "index": index, "signal": _signal.Signals(sig).name,
                                  "graceful_wait": server.graceful_wait if sig == _signal.SIGTERM else 0,
                                  "stop": time.time(), "down": None, "up": None}  # fmt: skip
        try:
            if endpoints is None:
                server.stop(sig)
                record["down"] = time.time()
                server.start()
            else:
                moved = endpoints.move(index, sig, between=lambda: record.update(down=time.time()))
                record["summary"] = (
                    f"{moved}, down {record['down'] - record['stop']:.1f} s, serving {time.time() - record['down']:.1f} s later"
                )
            record["up"] = time.time()
        except Exception as exc:  # noqa: BLE001 - said in the record; one more try to bring it back
            record["error"] = f"{type(exc).__name__}: {exc}"
            record["down"] = record["down"] or time.time()
            try:
                if not server.is_running():
                    server.start()
                record["up"] = time.time()
            except Exception as again:  # noqa: BLE001
                record["error"] += f"; started again: {type(again).__name__}: {again}"
        return record

    return event


SOAK_FAULTS = ("graceful restart", "graceful restart", "SQL-layer crash", "partition", "lost DDL answer", "idle sessions closed")
DDL_TEXT = re.compile(r"\s*(CREATE\s+TABLE|ALTER\s+TABLE|CREATE\s+INDEX)\b.*audit_", re.IGNORECASE | re.DOTALL)


def soak_event(tidb: TiDB, shim: FaultShim, seed: int) -> Callable[[int], dict[str, Any]]:
    """A fault of ``SOAK_FAULTS`` in random order (``seed``), on the tidb-server behind
    ``shim`` (what DM, or the middle, connects to): a graceful restart (SIGTERM; the next
    start's graceful-wait-before-shutdown 0 or 3 s at random), the SQL layer crashing (every connection cut, connects refused for a second), a
    partition of the shim's port for 5-90 s (every packet dropped, no FIN, no RST), the answer
    of the next DDL of DM's lost (TiDB runs it, the client never hears), the idle sessions
    closed by the server (as at a wait_timeout)."""
    rng = random.Random(seed)

    def event(n: int) -> dict[str, Any]:
        kind = rng.choice(SOAK_FAULTS)
        record: dict[str, Any] = {"server": "tidb", "index": 0, "signal": kind, "kind": kind, "graceful_wait": 0,
                                  "stop": time.time(), "down": None, "up": None}  # fmt: skip
        try:
            if kind == "graceful restart":
                record["graceful_wait"] = tidb.graceful_wait
                tidb.stop()
                record["down"] = time.time()
                tidb.graceful_wait = rng.choice((0, 3))  # read by the next start
                tidb.start()
                detail = f"graceful wait {record['graceful_wait']} s, stopped {record['down'] - record['stop']:.1f} s after SIGTERM"
            elif kind == "SQL-layer crash":
                cut = shim.crash(down=1.0, reset=bool(n % 2))
                record["down"] = record["stop"]
                detail = f"{len(cut)} connections cut ({'RST' if n % 2 else 'FIN'}), connects refused for 1 s"
            elif kind == "partition":
                seconds = rng.uniform(5, 90)
                with Partition(shim.port):
                    record["down"] = time.time()
                    time.sleep(seconds)
                detail = f"{seconds:.0f} s, every packet to and from the port dropped"
            elif kind == "lost DDL answer":
                rule = shim.drop_answer(match=lambda cmd: cmd.sql is not None and DDL_TEXT.match(cmd.sql) is not None)
                applied = shim.wait_applied(rule, timeout=30)
                shim.disarm(rule)
                record["down"], record["applied"] = time.time(), applied
                detail = "the next DDL ran, its answer dropped, both sockets closed" if applied else "no DDL came within 30 s"
            else:
                closed = shim.close_idle_connections()
                record["down"] = record["stop"]
                detail = f"{len(closed)} idle connections closed by the server (FIN)"
            record["up"] = time.time()
            record["summary"] = f"{kind}: {detail}"
        except Exception as exc:  # noqa: BLE001 - said in the record; the schedule goes on
            record["error"] = f"{type(exc).__name__}: {exc}"
            record["down"] = record["down"] or time.time()
            if not tidb.is_running():
                tidb.start()
            record["up"] = time.time()
        return record

    return event


class Shimmed:
    """The tidb-server as a middle sees it: the fault shim's port, the server's status port."""

    def __init__(self, tidb: TiDB, shim: FaultShim) -> None:
        self.port, self.status_port = shim.port, tidb.status_port


def proxy_event(proxy: ProxyProcess, kind: str, workers: int = 1) -> tuple[Callable[[int], dict[str, Any]], Callable[[], None]]:
    """The proxy's own fault (``--chaos``), and how to stop the proxy serving at the end:
    ``proxy-upgrade``: SIGUSR2, done once the new process serves and the old one exited (every
    session moved, or drained at listen.handover_timeout); with ``workers`` > 1 SIGUSR2 to the
    supervisor, done once it re-executed itself and every old worker exited;
    ``proxy-restart``: SIGTERM (the sessions drain), then the same config started again, as
    ``systemctl restart``."""
    upgraded = Upgraded(proxy)

    def event(n: int) -> dict[str, Any]:
        record: dict[str, Any] = {"server": "proxy", "index": 0, "graceful_wait": 0, "stop": time.time(), "down": None, "up": None}
        try:
            if kind == "proxy-upgrade" and workers > 1:
                record["signal"] = "SIGUSR2"
                record.update(_upgrade_workers(proxy))
                record["down"] = record["up"] = time.time()
                record["summary"] = (f"upgrade of {workers} workers {record['pids']} in {record['up'] - record['stop']:.1f} s: "
                                     f"{record['moved']} session(s) moved, {record['drained']} drained")  # fmt: skip
            elif kind == "worker-kill":
                record["signal"] = "SIGKILL"
                record.update(_kill_worker(proxy, n % workers))
                record["down"], record["up"] = record["stop"], time.time()
                record["summary"] = (f"SIGKILL of worker {n % workers} (pid {record['pid']}): replaced by pid {record['new_pid']} "
                                     f"in {record['up'] - record['stop']:.1f} s; {record['taken_over']} session(s) taken over, "
                                     f"{record['closed']} closed")  # fmt: skip
            elif kind == "proxy-upgrade":
                record["signal"] = "SIGUSR2"
                old = upgraded.pid
                new = upgraded.signal_upgrade()
                record["down"] = record["up"] = time.time()
                text = proxy.log_text()
                moved = text.count(f"moved to pid {new} with its client")
                left = [line for line in text.splitlines() if f"not moved to pid {new}" in line]
                record.update(pid=new, moved=moved, drained=len(left))
                record["summary"] = (f"upgrade pid {old} -> {new} in {record['up'] - record['stop']:.1f} s: {moved} session(s) moved, "
                                     f"{len(left)} drained")  # fmt: skip
            else:
                record["signal"] = "SIGTERM"
                proxy.stop(timeout=60)
                record["down"] = time.time()
                proxy.start()
                record["up"] = time.time()
                record["summary"] = (f"restart: stopped {record['down'] - record['stop']:.1f} s after SIGTERM, "
                                     f"serving {record['up'] - record['down']:.1f} s later")  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - said in the record; the next event tries again
            record["error"] = f"{type(exc).__name__}: {exc}"
            record["down"] = record["down"] or time.time()
            record["up"] = record["up"] or (time.time() if _serves(proxy.port) else None)
        return record

    def stop() -> None:
        if kind == "proxy-upgrade":
            upgraded.stop()

    return event, stop


def _upgrade_workers(proxy: ProxyProcess) -> dict[str, Any]:
    """SIGUSR2 to the supervisor; once it has re-executed itself and its old workers exited:
    the new workers' pids and the sessions they took over (moved) or left to drain."""
    done = "re-executed with the code on disk"
    before = proxy.log_text().count(done)
    proxy.proc.send_signal(_signal.SIGUSR2)
    wait_for(lambda: proxy.log_text().count(done) > before, timeout=180, what="the supervisor's re-exec")
    wait_for(lambda: not _healthz(proxy.admin_port)["draining_pids"], timeout=120, what="the old workers to exit")
    pids = _healthz(proxy.admin_port)["pids"]
    text = proxy.log_text()
    return {"pids": pids, "moved": sum(text.count(f"moved to pid {pid} with its client") for pid in pids),
            "drained": sum(text.count(f"not moved to pid {pid}") for pid in pids)}  # fmt: skip


def _kill_worker(proxy: ProxyProcess, index: int) -> dict[str, Any]:
    """SIGKILL worker ``index``; once the supervisor has started another in its place and that
    one took the dead one's sessions over (or 60 s passed): the pids and the sessions taken
    over or closed (from the proxy's log)."""
    before = proxy.log_text()
    pid = _healthz(proxy.admin_port)["pids"][index]
    _os.kill(pid, _signal.SIGKILL)
    wait_for(lambda: _healthz(proxy.admin_port)["pids"][index] not in (pid, None), timeout=60, what=f"worker {index} replaced")
    new_pid = _healthz(proxy.admin_port)["pids"][index]

    def settled() -> bool:  # the keeper handed everything over (nothing left orphaned)
        text = proxy.log_text()[len(before) :]
        left = re.search(rf"worker {index} \(pid {pid}\) left (\d+) session", text)
        done = text.count(f"from worker pid {pid}, which died (") + text.count(f"worker pid {pid}, which ran it, died")
        return left is None or done >= int(left.group(1))

    try:
        wait_for(settled, timeout=60, what=f"the sessions of worker pid {pid} taken over")
    except AssertionError:
        pass  # reported as counted
    text = proxy.log_text()[len(before) :]
    return {"pid": pid, "new_pid": new_pid, "taken_over": text.count(f"from worker pid {pid}, which died ("),
            "closed": text.count(f"worker pid {pid}, which ran it, died")}  # fmt: skip


def _healthz(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
        return json.load(response)


def _serves(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return True
    except OSError:
        return False


def subtask_units(answer: Any) -> list[tuple[str, str]]:
    """(stage, unit) of every subtask in a ``query-status <task>`` answer
    (``sources[].subTaskStatus[]``, looked for anywhere in the document)."""
    found = []
    if isinstance(answer, dict):
        for key, value in answer.items():
            if key == "subTaskStatus" and isinstance(value, list):
                found += [(str(st.get("stage", "")), str(st.get("unit", ""))) for st in value if isinstance(st, dict)]
            else:
                found += subtask_units(value)
    elif isinstance(answer, list):
        for item in answer:
            found += subtask_units(item)
    return found


def answering(servers: list[Any], first: int = 0) -> list[Any]:
    """``servers`` in the order to try them, starting from index ``first``."""
    return [servers[(first + k) % len(servers)] for k in range(len(servers))]


class Sampler(threading.Thread):
    """Every second the heartbeat lag read downstream (on the first of ``servers`` that answers,
    starting from the last one that did) and the load's counts so far; every ``status_every``
    seconds DM's units (``query-status``), and when the sync unit first ran; with
    ``count_rows``, every ``rows_every`` seconds until then the rows of ``tables`` downstream."""

    def __init__(self, servers: list[TiDB], dm: DMCluster, load: dm_load.ShopLoad | None = None, status_every: float = 2.0,
                 count_rows: list[str] | None = None, rows_every: float = 3.0) -> None:  # fmt: skip
        super().__init__(daemon=True, name="sampler")
        self.servers, self.dm, self.load, self.status_every = servers, dm, load, status_every
        self.count_rows, self.rows_every = count_rows, rows_every
        self.stop_event = threading.Event()
        self.lag: list[tuple[float, float | None]] = []
        self.progress: list[tuple[float, int, int]] = []  # (time, upstream transactions, statements) so far
        self.rows: list[tuple[float, int]] = []  # (time, rows of count_rows downstream)
        self.units: list[tuple[float, list[tuple[str, str]]]] = []
        self.sync_running_at: float | None = None  # first query-status with every subtask Running in Sync
        self._good = 0

    def run(self) -> None:
        last_status = last_rows = 0.0
        while not self.stop_event.wait(1.0):
            self.lag.append((time.time(), self.read_lag()))
            if self.load is not None:
                self.progress.append((time.time(), self.load.stats.transactions, self.load.stats.statements))
            if time.monotonic() - last_status >= self.status_every:
                last_status = time.monotonic()
                self.poll_status()
            if self.count_rows and self.sync_running_at is None and time.monotonic() - last_rows >= self.rows_every:
                last_rows = time.monotonic()
                n = count_rows(answering(self.servers, self._good), self.count_rows)
                if n is not None:
                    self.rows.append((time.time(), n))

    def read_lag(self) -> float | None:
        for k, server in enumerate(answering(self.servers, self._good)):
            lag = dm_load.heartbeat_lag(server.port, server.host)
            if lag is not None:
                self._good = (self._good + k) % len(self.servers)
                return lag
        return None

    def poll_status(self) -> None:
        try:
            units = subtask_units(self.dm.ctl("query-status", TASK, timeout=30))
        except Exception:  # dmctl busy or the master unreachable: the next poll says
            return
        now = time.time()
        if not self.units or self.units[-1][1] != units:
            self.units.append((now, units))
        if self.sync_running_at is None and units and all(stage == "Running" and unit == "Sync" for stage, unit in units):
            self.sync_running_at = now

    def in_sync(self) -> bool:
        return self.sync_running_at is not None


def count_rows(servers: list[TiDB], tables: list[str]) -> int | None:
    """Rows of ``tables`` downstream in all (a table not there yet: 0), on the first of
    ``servers`` that answers (where it is now); None if none does."""
    for server in servers:
        try:
            conn = pymysql.connect(host=server.host, port=server.port, user="root", password="", connect_timeout=2, read_timeout=30)
        except pymysql.MySQLError:
            continue
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (dm_load.SCHEMA,))
                present = {row[0].lower() for row in cur.fetchall()}
                total = 0
                for table in tables:
                    if table.lower() in present:
                        cur.execute(f"SELECT COUNT(*) FROM `{dm_load.SCHEMA}`.`{table}`")
                        total += int(cur.fetchone()[0])
                return total
        except pymysql.MySQLError:
            continue
        finally:
            conn.close()
    return None


def task_yaml(path: Path, port: int, dump_dir: Path, safe_mode: bool = False) -> Path:
    path.write_text(f"""name: "{TASK}"
task-mode: all
meta-schema: "dm_meta"
target-database:
  host: "127.0.0.1"
  port: {port}
  user: "{DM_USER}"
  password: "{DM_PASSWORD}"
block-allow-list:
  bw:
    do-dbs: ["{dm_load.SCHEMA}"]
mydumpers:
  global:
    threads: 4
    chunk-filesize: 8
loaders:
  global:
    pool-size: 16
    dir: "{dump_dir}"
    import-mode: "logical"
    on-duplicate-logical: "replace"
syncers:
  global:
    worker-count: 16
    batch: 100
    safe-mode: {"true" if safe_mode else "false"}
mysql-instances:
  - source-id: "{SOURCE_ID}"
    block-allow-list: "bw"
    mydumper-config-name: "global"
    loader-config-name: "global"
    syncer-config-name: "global"
""")
    return path


def source_yaml(path: Path, port: int) -> Path:
    path.write_text(f"""source-id: "{SOURCE_ID}"
flavor: "mariadb"
enable-gtid: false
from:
  host: "127.0.0.1"
  port: {port}
  user: "root"
  password: ""
""")
    return path


def pin_threads(pid: int | None, cpus: set[int]) -> None:
    """Every thread of ``pid`` on ``cpus`` (the threads it starts later inherit it)."""
    assert pid is not None, "tidb-server is not running"
    for task in _os.listdir(f"/proc/{pid}/task"):
        _os.sched_setaffinity(int(task), cpus)


def run_target(spec: dm_builds.RunSpec, args: argparse.Namespace, workdir: Path, log) -> dict[str, Any]:
    """One run: ``spec``'s DM build writing through its middle (``spec.target``), in a fresh lab."""
    target = spec.target
    workdir.mkdir(parents=True)
    up = MariaDB(workdir / "upstream", extra_args=UPSTREAM_ARGS)
    cluster: Cluster | None = None
    tidb: TiDB | None = None
    middle = lab = None
    dm: DMCluster | None = None
    restarter = sampler = load = chaos = stop_chaos = shim = None
    try:
        up.start()
        t = time.time()
        rows = dm_load.create_and_preload(up.port, args.scale)
        log(f"  upstream preloaded in {time.time() - t:.0f} s: {rows}")
        if args.cluster:
            cluster = Cluster(workdir / "cluster", servers=args.servers, graceful_wait=args.graceful_wait,
                              hosts=dm_discovery.needs_hosts(args))  # fmt: skip
            for server in cluster.servers:
                server.general_log = args.general_log  # read when each one writes its config
            t = time.time()
            cluster.start()
            log(f"  cluster up in {time.time() - t:.0f} s: PD {cluster.pd.address}, tidb-servers on {cluster.addresses}")
            cluster.create_user(DM_USER, DM_PASSWORD)
            servers = cluster.servers
            lab = dm_discovery.LabDiscovery(args.discovery, cluster, workdir).start()
            event = cluster_event(cluster, SIGNALS.get(args.faults, _signal.SIGTERM), lab.endpoints if args.faults == "moving" else None)
        else:
            tidb = TiDB(workdir / "tidb", graceful_wait=args.graceful_waits[0], general_log=args.general_log)
            tidb.start()
            if args.pin_tidb is not None:
                pin_threads(tidb.pid, args.tidb_cpus)
                log(f"  tidb-server on CPU {args.pin_tidb}, everything else on CPU {','.join(map(str, sorted(_os.sched_getaffinity(0))))}")
            tidb.create_user(DM_USER, DM_PASSWORD)
            servers = [tidb]
            event = single_server_event(tidb, args.graceful_waits)
        faulted: list[Any] = list(servers)  # ``servers``: where the bench itself reads (never through a fault)
        if args.faults == "soak":
            shim = FaultShim(tidb.port).start()
            faulted = [Shimmed(tidb, shim)]
            event = soak_event(tidb, shim, args.seed)
        port, middle = start_middle(target, workdir, faulted, cluster.pd.address if cluster else None, DM_USER, DM_PASSWORD,
                                    args.buffer_window, args.proxy_workers, lab.backend() if lab else None)  # fmt: skip
        dm = DMCluster(workdir / "dm", spec.build.folder)
        dm.start()
        dm.create_source(source_yaml(workdir / "source.yaml", up.port))
        task = task_yaml(workdir / "task.yaml", port, workdir / "dumped", spec.safe_mode)
        check = dm.ctl("check-task", str(task))
        load = dm_load.ShopLoad(up.port, args.rate, ddl_interval=10 if args.faults == "soak" else 20)
        preloaded = list(rows)
        sampler = Sampler(servers, dm, load, count_rows=preloaded if args.faults == "none" else None)
        ready = sampler.in_sync if args.chaos_from == "sync" else None
        restarter = Restarter(event, args.interval, log, args.restarts, ready, start_to_start=args.cluster)
        if args.chaos:  # the proxy's own faults, beside TiDB's (if any)
            chaos_event, stop_chaos = proxy_event(middle, args.chaos, args.proxy_workers)
            chaos = Restarter(chaos_event, args.chaos_interval, log, args.chaos_events, ready, start_to_start=True)
        started = time.time()
        answer = dm.ctl("start-task", str(task))
        if not answer.get("result"):
            raise RuntimeError(f"start-task failed: {json.dumps(answer)[:2000]}")
        load.start()
        sampler.start()
        restarter.start()
        if chaos is not None:
            chaos.start()
        faults = describe_faults(args)
        log(f"  task started; load at {args.rate:g} txn/s for at least {args.duration:g} s; {faults}")
        backlog = None
        if args.faults == "none":
            labels = {middle.proc.pid: "middle"} if middle is not None else {}
            backlog = measure_backlog(dm, sampler, load, args, started + args.duration, log, labels, (port, servers[0].port))
        time.sleep(max(0.0, started + args.duration - time.time()))
        if args.faults == "soak":  # faults for --soak seconds: the one under way ends, no other begins
            restarter.stop_event.set()
            restarter.join(180)
            args.restarts = len(restarter.restarts)
        # Every target gets the same number of restarts: wait for the schedule (bounded), and
        # keep the load on for an interval after the last one.
        limit = time.time() + args.restarts * (args.interval + 180) + (args.sync_timeout if args.chaos_from == "sync" else 0)
        while restarter.is_alive() and time.time() < limit:
            restarter.join(1.0)
        done = [x for x in restarter.restarts if x.get("up") is not None]
        if args.restarts and len(done) == args.restarts:
            time.sleep(max(0.0, done[-1]["up"] + args.interval - time.time()))
        elif args.restarts:
            log(f"  only {len(done)} of {args.restarts} restarts happened"
                + (" (the sync unit never ran)" if args.chaos_from == "sync" and not sampler.in_sync() else ""))  # fmt: skip
        if chaos is not None:
            chaos_limit = time.time() + args.chaos_events * (args.chaos_interval + 60)
            while chaos.is_alive() and time.time() < chaos_limit:
                chaos.join(1.0)
            chaos.stop_event.set()
            chaos.join(120)
        restarter.stop_event.set()
        restarter.join(120)
        stats = load.stop()
        ended = time.time()
        log(f"  load stopped: {stats.transactions} transactions upstream; waiting for DM to catch up")
        caught_up = wait_caught_up(up, servers, args.catch_up)
        sampler.stop_event.set()
        sampler.join(10)
        try:
            numbers = middle_numbers(middle) or {}
        except Exception as exc:  # noqa: BLE001 - the run's other results stand
            log(f"  reading the middle's numbers failed: {exc}")
            numbers = {"middle_numbers_error": f"{type(exc).__name__}: {exc}"}
        upstream, downstream = dm_load.checksums(up.port), checksums_on(servers)
        if args.general_log:
            corpus = dm_statements((cluster or tidb).error_log_text())
            with open(workdir / "dm_statements.jsonl", "w") as f:
                f.writelines(json.dumps(entry) + "\n" for entry in corpus)
            log(f"  {len(corpus)} statement shapes of DM in TiDB's general log: {workdir / 'dm_statements.jsonl'}")
        manual = [(backlog["paused_at"], backlog["resumed_at"])] if backlog and "resumed_at" in backlog else []
        events = dm_events(dm, started, sync_running_at=sampler.sync_running_at, manual=manual)
        return {
            "target": target, "dm_build": spec.build.to_json(), "safe_mode": spec.safe_mode,
            "downstream": f"cluster of {len(servers)} tidb-servers" if cluster else "tidb-server",
            "faults": args.faults, "graceful_wait": args.graceful_wait if cluster else None, "discovery": args.discovery,
            "check_task": check.get("result"),
            "started": started, "ended": ended, "caught_up_after": caught_up,
            "chaos_from": args.chaos_from, "restarts_planned": args.restarts, "restarts_began": restarter.began,
            "restarts": [dict(x, phase=phase_at(x["stop"], events["sync_started"])) for x in restarter.restarts],
            "chaos": args.chaos, "chaos_interval": args.chaos_interval if args.chaos else None,
            "proxy_events": [dict(x, phase=phase_at(x["stop"], events["sync_started"])) for x in chaos.restarts] if chaos else [],
            "units": sampler.units,
            "load": {"transactions": stats.transactions, "statements": stats.statements, "errors": len(stats.errors)},
            "preloaded": rows,
            "lag": sampler.lag,
            "rates": replication_rates(sampler.rows, events, backlog, sampler.lag, sampler.progress,
                                       None if caught_up is None else ended + caught_up) if args.faults == "none" else None,
            "rows_downstream": sampler.rows,
            "dm": events,
            "proxy": None, "tiproxy": None, "haproxy": None, **numbers,
            "tables": {name: {"upstream": upstream[name], "downstream": downstream.get(name)} for name in upstream},
            "identical": upstream == downstream,
        }  # fmt: skip
    finally:
        for thread in (restarter, sampler, chaos):
            if thread is not None:
                thread.stop_event.set()
        for thread in (restarter, chaos):
            if thread is not None and thread.is_alive():
                thread.join(120)  # a restart under way ends before its server is stopped
        if stop_chaos is not None:
            try:
                stop_chaos()  # the process serving after the upgrades: not the one ``middle`` started
            except Exception as exc:  # noqa: BLE001 - the others are stopped anyway
                log(f"  stopping the upgraded proxy: {exc}")
        if load is not None:
            load.stop()
        for stop in (dm.stop if dm else None, middle.stop if middle else None, (lambda: teardown(cluster)) if cluster else None,
                     shim.stop if shim else None, tidb.stop if tidb else None, lab.stop if lab else None, up.stop):  # fmt: skip
            if stop is not None:
                try:
                    stop()
                except Exception as exc:  # the others are stopped anyway
                    log(f"  stopping: {exc}")
        if not args.keep_data:
            drop_data(workdir)


# What a run leaves that is data, not evidence (2-3 GB a run at --scale 60000): the logs stay.
DATA_DIRS = ("upstream/data", "cluster/store/data", "cluster/pd/data", "tidb/store", "dumped", "dm/relay", "dm/master-data",
             "tiproxy/work")  # fmt: skip


def drop_data(workdir: Path) -> None:
    for name in DATA_DIRS:
        shutil.rmtree(workdir / name, ignore_errors=True)


def teardown(cluster: Cluster) -> None:
    """The run is read: the tidb-servers SIGKILLed, then the store and PD stopped (a graceful
    shutdown after the run was seen to hang 60 s on TiDB's stats dump, a lock wait)."""
    for server in cluster.servers:
        server.kill()
    cluster.stop()


def describe_faults(args: argparse.Namespace) -> str:
    if args.faults == "soak":
        return (f"for {args.soak:g} s one fault {args.interval:g} s after the last ended, in random order (seed {args.seed}): "
                + ", ".join(SOAK_FAULTS))  # fmt: skip
    if args.faults == "none":
        return f"no faults: the task paused {args.backlog:g} s once the sync runs (DM's catch-up rate)"
    when = "the start" if args.chaos_from == "start" else "the sync unit on"
    if args.chaos:
        what = {"proxy-upgrade": "upgrades (SIGUSR2)", "proxy-restart": "restarts (SIGTERM, started again)",
                "worker-kill": f"worker kills (SIGKILL, one of {args.proxy_workers} in turn)"}[args.chaos]  # fmt: skip
        own = f"{args.chaos_events} proxy {what} every {args.chaos_interval:g} s from {when}"
        return own if args.faults == "off" else f"{own}; and {_tidb_faults(args, when)}"
    return _tidb_faults(args, when)


def _tidb_faults(args: argparse.Namespace, when: str) -> str:
    if not args.cluster:
        return f"{args.restarts} TiDB restarts {args.interval:g} s apart from {when}"
    what = {"rolling": "rolling restart (SIGTERM)", "kill": "crashes (SIGKILL)",
            "moving": f"rolling restart (SIGTERM) on new addresses (discovery {args.discovery})"}[args.faults]  # fmt: skip
    wait = f", graceful wait {args.graceful_wait} s" if args.faults != "kill" else ""
    return f"{args.restarts} tidb-server {what}{wait}, one server at a time, every {args.interval:g} s from {when}"


def measure_backlog(dm: DMCluster, sampler: Sampler, load: dm_load.ShopLoad, args: argparse.Namespace, stop_by: float,
                    log, labels: dict[int, str], ports: tuple[int, int]) -> dict[str, Any]:  # fmt: skip
    """Once DM's sync unit runs (and 15 s more), pause the task for ``args.backlog`` seconds
    while the load goes on, then resume it: a backlog DM drains at its own pace through the
    middle (``replication_rates`` reads the pace off the lag). Caught up: the first lag sample
    after the resume within 1 s of the lag before the pause (at least 2 s); DM may also never
    get there before the load is due to stop (``stop_by``; a machine too busy for the offered
    rate): then the run's final catch-up ends it. ``cpu``: the cores each command (the pids in
    ``labels`` by their label) used while DM drained, and the machine's. ``hops``
    (``--capture-hops``): the round trips on ``ports`` (DM's, the server's) while it drained."""
    deadline = time.time() + args.sync_timeout
    while not sampler.in_sync() and time.time() < deadline:
        time.sleep(1)
    if not sampler.in_sync():
        log("  the sync unit never ran: no backlog measured")
        return {"error": "the sync unit never ran"}
    time.sleep(15)
    before = [v for t, v in sampler.lag[-10:] if v is not None]
    baseline = statistics.median(before) if before else 0.0
    threshold = max(2.0, baseline + 1.0)
    paused_at, txns0 = time.time(), load.stats.transactions
    answer = dm.ctl("pause-task", TASK)
    if not answer.get("result"):
        return {"error": f"pause-task: {json.dumps(answer)[:500]}"}
    log(f"  task paused for {args.backlog:g} s (lag before: {baseline:.1f} s)")
    time.sleep(args.backlog)
    resumed_at = time.time()
    share = procstat.CpuShare(labels).start()
    capture = hops.LoCapture(args.capture_hops, delay=6.0) if args.capture_hops else None
    if capture is not None:
        capture.start()
    answer = dm.ctl("resume-task", TASK)
    out: dict[str, Any] = {"paused_at": paused_at, "resumed_at": resumed_at, "lag_before": baseline, "threshold": threshold,
                           "behind_txns": load.stats.transactions - txns0, "caught_up_at": None}  # fmt: skip
    if not answer.get("result"):
        out["error"] = f"resume-task: {json.dumps(answer)[:500]}"
        return out
    limit = resumed_at + args.catch_up
    while time.time() < min(limit, stop_by):
        recent = [(t, v) for t, v in sampler.lag if t > resumed_at + 2 and v is not None]
        if recent and recent[-1][1] <= threshold:
            out["caught_up_at"] = recent[-1][0]
            break
        time.sleep(1)
    out["cpu"] = share.stop()
    if capture is not None:
        out["hops"] = hop_figures(capture, *ports)
        log(f"  round trips while draining: {json.dumps(out['hops'])[:600]}")
    cores = ", ".join(f"{name} {n:.2f}" for name, n in list(out["cpu"]["cores_by_command"].items())[:6])
    log(f"  CPU while draining: {out['cpu']['machine_busy_cores']:.2f} of {out['cpu']['machine_cores']:.2f} cores busy ({cores})")
    if out["caught_up_at"] is None:
        log("  the backlog was not drained while the load ran: the final catch-up ends it")
    else:
        log(f"  backlog of {out['behind_txns']} transactions drained in {out['caught_up_at'] - resumed_at:.0f} s")
    return out


def hop_figures(capture: hops.LoCapture, front: int, back: int) -> dict[str, Any]:
    """What ``capture`` saw (it is joined): the round trips DM's connections make to ``front``
    and, through a middle (``front`` is not ``back``), each one's hops (bench/hops.py)."""
    capture.join(capture.delay + capture.seconds + 30)
    if capture.error:
        return {"error": capture.error}
    trips = hops.round_trips(capture.packets, front)
    out: dict[str, Any] = {"packets": len(capture.packets), "dm_round_trip": hops.summary([b - a for a, b, *_ in trips])}
    if front != back:
        out.update({name: hops.summary(values) for name, values in hops.hops(capture.packets, front, back).items()})
    return out


def applied(lag: list[tuple[float, float | None]], progress: list[tuple[float, int, int]]) -> list[tuple[float, float, float]]:
    """(t, upstream transactions, statements) DM had applied downstream at t: the heartbeat read
    at t is the upstream clock of the last applied heartbeat (t - lag); what the load had written
    by then (``progress``, interpolated) is applied."""
    out = []
    times = [p[0] for p in progress]
    for t, v in lag:
        if v is None or not progress:
            continue
        at = t - v
        i = bisect.bisect_right(times, at)
        if i == 0:
            txns, stmts = 0.0, 0.0
        elif i == len(times):
            txns, stmts = float(progress[-1][1]), float(progress[-1][2])
        else:
            (t0, a0, b0), (t1, a1, b1) = progress[i - 1], progress[i]
            f = (at - t0) / (t1 - t0) if t1 > t0 else 0.0
            txns, stmts = a0 + f * (a1 - a0), b0 + f * (b1 - b0)
        out.append((t, txns, stmts))
    return out


def replication_rates(rows: list[tuple[float, int]], events: dict[str, Any], backlog: dict[str, Any] | None,
                      lag: list = (), progress: list = (), drained_at: float | None = None) -> dict[str, Any]:  # fmt: skip
    """The full load's rate from the downstream row counts (first count above 0 to the last one
    before the sync started: rows/s) and its length from dm-worker's log (the switch from the
    Dump unit to the switch from the Load unit); the sync's rate while DM drained the backlog:
    upstream transactions and statements applied (``applied``) from 5 s after the resume (the
    syncer restarted) to the catch-up (the backlog's, or else ``drained_at``, the run's), per
    second."""
    sync_at = events.get("sync_started")
    loading = [(t, n) for t, n in rows if n > 0 and (sync_at is None or t <= sync_at)]
    out: dict[str, Any] = {"load_rows_per_s": None, "load_rows": None, "load_s": events.get("load_unit_s")}
    if len(loading) >= 2 and loading[-1][0] > loading[0][0]:
        out["load_rows"] = loading[-1][1] - loading[0][1]
        out["load_rows_per_s"] = out["load_rows"] / (loading[-1][0] - loading[0][0])
    out["backlog"] = backlog
    if backlog and backlog.get("resumed_at"):
        end = backlog.get("caught_up_at") or drained_at
        series = [x for x in applied(list(lag), list(progress)) if backlog["resumed_at"] + 5 <= x[0] <= (end or 0)]
        if end is not None:
            out["catch_up_s"] = end - backlog["resumed_at"]
        if len(series) >= 2 and series[-1][0] > series[0][0]:
            (a, txns_a, stmts_a), (b, txns_b, stmts_b) = series[0], series[-1]
            out.update(sync_window_s=b - a, txn_per_s=(txns_b - txns_a) / (b - a), statements_per_s=(stmts_b - stmts_a) / (b - a))
    return out


def checksums_on(servers: list[TiDB]) -> dict[str, tuple[int, int]]:
    """The downstream's checksums on the first server that answers (where it is now)."""
    error: Exception | None = None
    for server in servers:
        try:
            return dm_load.checksums(server.port, host=server.host)
        except pymysql.MySQLError as exc:
            error = exc
    raise RuntimeError(f"no tidb-server answered the checksums: {error}")


def wait_caught_up(up: MariaDB, servers: list[TiDB], timeout: float) -> float | None:
    """Seconds until every table's checksum downstream (on any server) equals upstream's (None:
    not within timeout)."""
    began = time.monotonic()
    upstream = dm_load.checksums(up.port)
    while time.monotonic() - began < timeout:
        try:
            if checksums_on(servers) == upstream:
                return time.monotonic() - began
        except Exception:
            pass
        time.sleep(5)
    return None


_NUMBERS = re.compile(r"\b\d{3,}\b")
_MESSAGE = re.compile(r'Message:\\"((?:[^"\\]|\\.)*?)\\"')
_CAUSE = re.compile(r'RawCause:\\"((?:[^"\\]|\\.)*?)\\"')


def error_kind(fields: str) -> str:
    """A short, stable name for the error of a ``unit process error`` line: what failed
    (``begin``, ``commit``, a statement) and the driver's or server's words, numbers blanked."""
    message, cause = _MESSAGE.search(fields), _CAUSE.search(fields)
    what = ""
    if message is not None:
        text = message.group(1)
        what = text.rsplit("execute statement failed: ", 1)[1] if "execute statement failed: " in text else text
        what = what if what in ("begin", "commit") else ("statement" if "execute statement failed" in text else what)
    cause_text = cause.group(1).replace('\\"', '"') if cause is not None else ""
    cause_text = re.sub(r"dial tcp [0-9.:]+: ", "dial: ", cause_text)
    return _NUMBERS.sub("N", f"{what}: {cause_text}" if cause_text else what)[:70]


# What dm-worker logs for a failed transaction, as DM sees it (tiflow dm/syncer/dbconn/db.go,
# dm/pkg/conn/baseconn.go; Lightning's TiDB backend for the full load): one line per failed try.
# Retried in place; v8.5.5 says a retryable error's try (a 1213) with ``retry strategy takes effect``
# (dm/pkg/retry/strategy.go), once per failed try of the batch.
SYNC_RETRIED = ("execute sql failed by connection error", "execute sql failed by retryable error", "retry strategy takes effect")
SYNC_GAVE_UP = ("execute statements failed after retry",)  # the batch failed for good: the unit errs, the task pauses
STATEMENT_FAILED = ("execute statement failed",)  # a statement of a batch (sync) or of a chunk (full load)
_ERROR_LINE = re.compile(r"^\[[^\]]+\] \[ERROR\]", re.M)


def phase_at(at: float, sync_started: float | None) -> str:
    """``sync`` from the moment DM's sync unit started, ``load`` (dump and full load) before."""
    return "sync" if sync_started is not None and at >= sync_started else "load"


def dm_events(dm: DMCluster, started: float, now: float | None = None, sync_running_at: float | None = None,
              manual: list[tuple[float, float]] = ()) -> dict[str, Any]:  # fmt: skip
    """What dm-worker's log says happened, per phase (``phase_at``: the sync phase starts at the
    log's switch from the Load unit, or at the first ``query-status`` that showed the Sync unit
    running, whichever came first). A pause with no resume after it (DM's ``task can't auto
    resume``: a load-unit error is not retried) lasts until ``now``, when the log is read. A
    pause that began within a second of a ``manual`` (pause-task .. resume-task) span is the
    bench's own: counted apart (``manual_pauses``), not as DM's, and so are the failures logged
    within it (the pause cancels the batch under way). ``load_unit_s``: from the log's
    switch from the Dump unit to its switch from the Load unit (the full load's length)."""
    now = time.time() if now is None else now

    def dm_own(events: list) -> list:
        return [e for e in events if not any(a - 1 <= e.at <= b + 1 for a, b in manual)]

    all_pauses = dm.pauses()
    pauses = dm_own(all_pauses)
    resumes = dm.events("dispatch auto resume task")
    failures = dm_own(dm.events("unit process error"))  # the errors a pause reports, one line each
    retried, gave_up = dm_own(dm.events(*SYNC_RETRIED)), dm_own(dm.events(*SYNC_GAVE_UP))
    statements = dm_own(dm.events(*STATEMENT_FAILED))
    switches = dm.events("switching to next unit")
    switched = [e.at for e in switches if "unit=Load" in e.fields]
    dumped = [e.at for e in switches if "unit=Dump" in e.fields]
    candidates = [t for t in (switched[-1] if switched else None, sync_running_at) if t is not None]
    sync_started = min(candidates) if candidates else None
    paused_for, spans, unresumed = 0.0, [], 0
    by_phase = {phase: {"pauses": 0, "paused_s": 0.0, "failed_txns": 0, "retried_in_place": 0, "gave_up": 0,
                        "failed_statements": 0, "unit_errors": 0} for phase in ("load", "sync")}  # fmt: skip
    for p in pauses:
        nxt = next((r.at for r in resumes if r.at >= p.at), None)
        spans.append((p.at - started, (nxt - started) if nxt else None))
        span = (nxt if nxt else now) - p.at
        paused_for += span
        unresumed += nxt is None
        by_phase[phase_at(p.at, sync_started)]["pauses"] += 1
        by_phase[phase_at(p.at, sync_started)]["paused_s"] += span
    for events, key in ((retried, "retried_in_place"), (gave_up, "gave_up"), (statements, "failed_statements"), (failures, "unit_errors")):
        for e in events:
            by_phase[phase_at(e.at, sync_started)][key] += 1
    # A failed transaction as DM sees it: in the sync, a batch try that failed (retried in place
    # or given up); in the full load, a statement of a chunk that failed (Lightning retries or
    # gives up on the chunk), since the load has no transaction of its own around it.
    for phase, counts in by_phase.items():
        counts["failed_txns"] = counts["retried_in_place"] + counts["gave_up"] if phase == "sync" else counts["failed_statements"]
        failed = retried + gave_up if phase == "sync" else statements
        counts["seen_1158"] = sum(1 for e in failed if phase_at(e.at, sync_started) == phase and "Error 1158" in e.fields)
    kinds = Counter(error_kind(e.fields) for e in failures)
    units = Counter(m.group(1) for e in pauses for m in [re.search(r"\[unit=\"?([^\]\"]+)", e.fields)] if m)
    load_unit_s = switched[-1] - dumped[-1] if switched and dumped and switched[-1] >= dumped[-1] else None
    return {"pauses": len(pauses), "paused_s": paused_for, "never_resumed": unresumed, "sync_started": sync_started,
            "manual_pauses": len(all_pauses) - len(pauses), "load_unit_s": load_unit_s,
            "pause_spans": spans, "paused_units": dict(units), "resumes": len(resumes), "by_phase": by_phase,
            "failed": dict(kinds.most_common()), "failed_total": sum(kinds.values()), "retried_in_place": len(retried),
            "failed_txns": sum(c["failed_txns"] for c in by_phase.values()),
            "seen_1158": sum(c["seen_1158"] for c in by_phase.values()),
            "error_lines": len(_ERROR_LINE.findall(dm.worker_log_text()))}  # fmt: skip


# TiDB logs a statement as [GENERAL_LOG] ... [user=u@h] ... [sql="..."], and a DDL as
# ["CRUCIAL OPERATION"] ... [sql="..."] [user=u@h].
_LOGGED_SQL = re.compile(r'\[sql=("(?:[^"\\]|\\.)*"|[^\]]*)\]')
_LOGGED_USER = re.compile(r"\[user=([^@\]]*)@")
_GO_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|[0-7]{3}|.)")
_SIMPLE_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "a": "\a", "b": "\b", "f": "\f", "v": "\v"}


def _go_unquote(text: str) -> str:
    if not (text.startswith('"') and text.endswith('"')):
        return text

    def one(m: re.Match) -> str:
        e = m.group(1)
        if e[0] in "xuU":
            return chr(int(e[1:], 16))
        if e[0] in "01234567" and len(e) == 3:
            return chr(int(e, 8))
        return _SIMPLE_ESCAPES.get(e, e)

    return _GO_ESCAPE.sub(one, text[1:-1])


def dm_statements(tidb_log: str, user: str = DM_USER, max_rows: int = 3) -> list[dict[str, Any]]:
    """DM's statements in TiDB's general log, one example per shape (literals blanked), with
    how often each shape came; a multi-row VALUES list is cut to its first ``max_rows`` rows
    (the judgement does not depend on how many)."""
    from proxy.sqltext import TokenKind, tokenize
    from proxy.sqltext.dialect import TIDB

    literal = {TokenKind.STRING, TokenKind.NUMBER, TokenKind.HEX, TokenKind.BIT}
    seen: dict[str, dict[str, Any]] = {}
    for line in tidb_log.splitlines():
        if "[GENERAL_LOG]" not in line and '["CRUCIAL OPERATION"]' not in line:
            continue
        m, who = _LOGGED_SQL.search(line), _LOGGED_USER.search(line)
        if m is None or who is None or who.group(1) != user:
            continue
        sql = _go_unquote(m.group(1))
        try:
            tokens = tokenize(sql, dialect=TIDB)
        except Exception:
            tokens = []
        shape = _shape(tokens, literal)
        if shape in seen:
            seen[shape]["count"] += 1
            continue
        seen[shape] = {"sql": _first_rows(sql, tokens, max_rows, literal), "count": 1}
    return list(seen.values())


def statement_shape(sql: str) -> tuple[str, str]:
    """The shape ``dm_statements`` counts ``sql`` under, and the example it keeps of it (lists
    cut to 3 items), to merge the statements of several runs."""
    from proxy.sqltext import TokenKind, tokenize
    from proxy.sqltext.dialect import TIDB

    literal = {TokenKind.STRING, TokenKind.NUMBER, TokenKind.HEX, TokenKind.BIT}
    tokens = tokenize(sql, dialect=TIDB)
    return _shape(tokens, literal), _first_rows(sql, tokens, 3, literal)


def _shape(tokens: list, literal: set) -> str:
    """The statement with literals as ``?``, a VALUES list as ``VALUES ...`` (any rows) and an
    ``IN`` list of literals as ``IN (...)`` (any length: DM's validator reads rows by key so)."""
    lists = dict(_in_lists(tokens, literal))
    out, depth, in_values, i = [], 0, False, 0
    while i < len(tokens):
        tok = tokens[i]
        if i in lists:
            out.append("(...)")
            i = lists[i] + 1
            continue
        i += 1
        text = "?" if tok.kind in literal else tok.text.upper()
        if text == "VALUES" and depth == 0:
            in_values = True
            out.append("VALUES ...")
            continue
        depth += (text == "(") - (text == ")")
        if in_values:
            if depth == 0 and text not in (")", ","):
                in_values = False
            else:
                continue
        out.append(text)
    return " ".join(out)


def _in_lists(tokens: list, literal: set) -> list[tuple[int, int]]:
    """(index of "(", index of its ")") of every ``IN (...)`` whose list holds only literals
    and rows of them (``IN ((1, 2), (3, 4))``), not a subquery nor an expression."""
    found = []
    for i, tok in enumerate(tokens[:-1]):
        if tok.text.upper() != "IN" or tokens[i + 1].text != "(":
            continue
        depth = 0
        for j in range(i + 1, len(tokens)):
            t = tokens[j]
            depth += (t.text == "(") - (t.text == ")")
            if depth == 0:
                found.append((i + 1, j))
                break
            if t.kind not in literal and t.text not in ("(", ")", ","):
                break
    return found


def _first_rows(sql: str, tokens: list, max_rows: int, literal: set) -> str:
    """``sql`` with a VALUES list cut after ``max_rows`` rows and an ``IN`` list of literals
    after ``max_rows`` items (what follows them kept: ``ON DUPLICATE KEY UPDATE ...``)."""
    cuts = []  # (from, to): spans of sql left out
    for open_, close in _in_lists(tokens, literal):
        depth, items = 0, 0
        for tok in tokens[open_ : close + 1]:
            depth += (tok.text == "(") - (tok.text == ")")
            if tok.text == "," and depth == 1:
                items += 1
                if items == max_rows:
                    cuts.append((tok.start, tokens[close].start))
                    break
    depth, rows, in_values, cut_from, last_row_end = 0, 0, False, None, None
    for tok in tokens:
        if in_values and depth == 0 and tok.text not in ("(", ","):
            break  # the VALUES list ended
        if tok.text.upper() == "VALUES" and depth == 0:
            in_values = True
        elif tok.text == "(":
            depth += 1
        elif tok.text == ")":
            depth -= 1
            if in_values and depth == 0:
                rows += 1
                last_row_end = tok.end
                if rows == max_rows:
                    cut_from = tok.end
    if cut_from is not None and last_row_end != cut_from:
        cuts.append((cut_from, last_row_end))
    for start, end in sorted(cuts, reverse=True):
        sql = sql[:start] + sql[end:]
    return sql


def column_label(r: dict[str, Any]) -> str:
    if r["target"] == "direct" and str(r.get("downstream", "")).startswith("cluster"):
        return "one server"
    return LABELS.get(r["target"], r["target"])


def lag_max(r: dict[str, Any]) -> str:
    """The largest lag while the load wrote (after it, the heartbeat row stands still: its "lag" grows)."""
    values = [v for t, v in r["lag"] if v is not None and t <= r["ended"]]
    return f"{max(values):.1f}" if values else "-"


def phase(r: dict[str, Any], name: str) -> dict[str, Any]:
    """What dm-worker's log says of phase ``name`` (``load`` or ``sync``) of run ``r``."""
    return r["dm"].get("by_phase", {}).get(name, {})


def restarts_in_phase(r: dict[str, Any], name: str) -> int:
    return sum(1 for x in r["restarts"] if x.get("phase", phase_at(x["stop"], r["dm"].get("sync_started"))) == name)


def build_of(r: dict[str, Any]) -> str:
    """The run's DM as it says of itself: version, and the fix if it carries it."""
    return (r.get("dm_build") or {}).get("description", "DM")


def render(results: dict[str, Any]) -> str:
    runs = results["runs"]
    lines = [f"{'':48}" + "".join(f"{build_of(r):>16}" for r in runs), f"{'':48}" + "".join(f"{column_label(r):>16}" for r in runs)]

    def row(label: str, fn) -> None:
        lines.append(f"{label:48}" + "".join(f"{fn(r):>16}" for r in runs))

    def lag_in_sync(r) -> str:  # the sync phase, while the load wrote: the full load's own lag left out
        at = r["dm"].get("sync_started")
        values = [v for t, v in r["lag"] if v is not None and at is not None and at <= t <= r["ended"]]
        return f"{max(values):.1f} / {statistics.median(values):.1f}" if values else "-"

    def restarts_in(name: str):
        return lambda r: str(restarts_in_phase(r, name))

    def sync_reached(r) -> str:
        at = r["dm"].get("sync_started")
        return "no" if at is None else f"at +{at - r['started']:.0f} s"

    def median_of(key_from: str, key_to: str):
        def fn(r) -> str:
            spans = [x[key_to] - x[key_from] for x in r["restarts"] if x.get(key_to) is not None and x.get(key_from) is not None]
            return f"{statistics.median(spans):.1f}" if spans else "-"

        return fn

    def has(key: str) -> bool:
        return any(r.get(key) for r in runs)

    row("downstream", lambda r: "cluster" if str(r.get("downstream", "")).startswith("cluster") else "one server")
    row("DM (dm-worker -V; +#12078: the seed's fix)", build_of)
    row("  syncers.safe-mode", lambda r: "on" if r.get("safe_mode") else "off")
    row("run (s) / TiDB restarts", lambda r: f"{r['ended'] - r['started']:.0f} / {len(r['restarts'])}")
    row("  signal", signals_of)
    row("  restarts planned / from", lambda r: f"{r.get('restarts_planned', '-')} / {r.get('chaos_from', 'start')}")
    row("  restarts during the full load (dump + load)", restarts_in("load"))
    row("  restarts during the sync", restarts_in("sync"))
    row("  restarts that failed", lambda r: str(sum(1 for x in r["restarts"] if "error" in x)))
    row("graceful waits (s)", lambda r: ",".join(sorted({str(x["graceful_wait"]) for x in r["restarts"]})) or "-")
    row("  server down after the signal, median (s)", median_of("stop", "down"))
    row("  serving again after that, median (s)", median_of("down", "up"))
    if has("proxy_events"):
        row("the proxy's own faults (--chaos)", lambda r: f"{len(r.get('proxy_events') or [])} {r.get('chaos') or ''}".strip())
        row("  of them failed", lambda r: str(sum(1 for x in r.get("proxy_events") or [] if "error" in x)))
        row("  sessions moved / drained (upgrades)", lambda r: "-" if r.get("chaos") != "proxy-upgrade" else
            f"{sum(x.get('moved', 0) for x in r['proxy_events'])} / {sum(x.get('drained', 0) for x in r['proxy_events'])}")  # fmt: skip
        row("  sessions taken over / closed (worker kills)", lambda r: "-" if r.get("chaos") != "worker-kill" else
            f"{sum(x.get('taken_over', 0) for x in r['proxy_events'])} / {sum(x.get('closed', 0) for x in r['proxy_events'])}")  # fmt: skip
        row("  each took, median (s)", lambda r: "-" if not r.get("proxy_events") else
            f"{statistics.median([x['up'] - x['stop'] for x in r['proxy_events'] if x.get('up')] or [0]):.1f}")  # fmt: skip
    row("DM reached the sync unit", sync_reached)
    row("upstream transactions", lambda r: str(r["load"]["transactions"]))
    for name, label in (("load", "full load"), ("sync", "sync")):
        row(f"{label}: DM pauses (dm-worker log)", lambda r, n=name: str(phase(r, n).get("pauses", "-")))
        row(f"{label}: time paused (s)", lambda r, n=name: f"{phase(r, n).get('paused_s', 0):.0f}")
        row(f"{label}: failed transactions as DM sees them*", lambda r, n=name: str(phase(r, n).get("failed_txns", "-")))
        row(f"{label}: of them 1158 (Error 1158 in DM's log)", lambda r, n=name: str(phase(r, n).get("seen_1158", "-")))
    row("  sync: batch tries retried in place by DM", lambda r: str(phase(r, "sync").get("retried_in_place", "-")))
    row("  sync: batches DM gave up on (-> pause)", lambda r: str(phase(r, "sync").get("gave_up", "-")))
    row("pauses never resumed", lambda r: str(r["dm"].get("never_resumed", 0)))
    row("auto-resumes", lambda r: str(r["dm"]["resumes"]))
    row("errors the pauses report (unit process error)", lambda r: str(r["dm"]["failed_total"]))
    kinds = sorted({k for r in runs for k in r["dm"]["failed"]}, key=lambda k: -max(r["dm"]["failed"].get(k, 0) for r in runs))
    for kind in kinds[:8]:
        row(f"  {kind[:46]}", lambda r, k=kind: str(r["dm"]["failed"].get(k, 0)))
    row("ERROR lines in dm-worker's log (raw)", lambda r: str(r["dm"].get("error_lines", "-")))
    row("max lag while the load ran (s, heartbeat)", lag_max)
    row("  in the sync: max / median (s)", lag_in_sync)
    row("proxy recoveries: resumed", lambda r: _outcome(r, "resumed"))
    row("proxy: 1213 (DM retries)", lambda r: _outcome(r, "aborted_1213"))
    row("proxy: refused, 1158", lambda r: _outcome(r, "aborted_1158"))
    reasons = sorted({k for r in runs if r.get("proxy") for k in r["proxy"].get("refused_by_reason", {})})
    for reason in reasons[:6]:
        row(f"  {reason[:46]}", lambda r, k=reason: "-" if not r.get("proxy") else str(r["proxy"].get("refused_by_reason", {}).get(k, 0)))
    row("proxy: sessions moved off a draining server", lambda r: "-" if not r.get("proxy") else str(r["proxy"].get("moved", "-")))
    row("proxy: servers found / gone (discovery)", lambda r: "-" if not r.get("proxy") or r.get("discovery", "static") == "static"
        else f"{r['proxy']['servers_found']} / {r['proxy']['servers_gone']}")  # fmt: skip
    row("proxy: replayed statements", lambda r: "-" if not r.get("proxy") else f"{r['proxy']['replayed_statements']:.0f}")
    if has("tiproxy"):
        row("TiProxy: sessions migrated (ok / failed)", _tiproxy(lambda t: f"{t['migrated']:.0f} / {t['migrate_failed']:.0f}"))
        row("  migrated for health (draining server)", _tiproxy(lambda t: f"{t['migrated_by_reason'].get('status', 0):.0f}"))
        row("  migrated to rebalance", _tiproxy(lambda t: f"{sum(v for k, v in t['migrated_by_reason'].items() if k != 'status'):.0f}"))
        row("TiProxy: sessions lost (no backend)", _tiproxy(lambda t: f"{t.get('lost', 0):.0f}"))
        row("TiProxy: log lines on migrations / redirects", _tiproxy(lambda t: str(t["log_migration_lines"])))
    if has("haproxy"):
        row("HAProxy: servers marked down / up", lambda r: "-" if not r.get("haproxy") else
            f"{r['haproxy']['marked_down']} / {r['haproxy']['marked_up']}")  # fmt: skip
    if has("rates"):
        row("full load: rows/s (row counts downstream)", _rate(lambda x: x.get("load_rows_per_s"), "{:.0f}"))
        row("full load: Load unit (s, dm-worker log)", _rate(lambda x: x.get("load_s"), "{:.0f}"))
        row("backlog: transactions behind after pause", _rate(lambda x: (x.get("backlog") or {}).get("behind_txns"), "{}"))
        row("backlog: drained in (s)", _rate(lambda x: x.get("catch_up_s"), "{:.0f}"))
        row("sync rate draining it: txn/s", _rate(lambda x: x.get("txn_per_s"), "{:.0f}"))
        row("sync rate draining it: statements/s", _rate(lambda x: x.get("statements_per_s"), "{:.0f}"))
        row("CPU draining it: machine busy (cores)", _rate(lambda x: _drain_cpu(x, None), "{:.2f}"))
        for name in ("tidb-server", "dm-worker", "middle"):
            row(f"  of which {name} (cores)", _rate(lambda x, name=name: _drain_cpu(x, name), "{:.2f}"))
        if any(((r.get("rates") or {}).get("backlog") or {}).get("hops") for r in runs):
            for key, label in HOPS:
                row(f"drain: {label} (ms, mean / p50)", _rate(lambda x, key=key: _hop(x, key), "{}"))
    row("caught up after the load (s)", lambda r: "no" if r["caught_up_after"] is None else f"{r['caught_up_after']:.0f}")
    row("tables identical (count + checksum)", lambda r: "yes" if r["identical"] else "NO")
    row("rows compared (this run, upstream)", lambda r: str(sum(v["upstream"][0] for v in r["tables"].values())))
    lines += [
        "",
        "* failed transactions as DM sees them: in the sync, every batch try (BEGIN .. COMMIT) that failed, whether DM",
        "  retried it in place or gave up on it; in the full load, every statement of a chunk that failed. The phases",
        "  split where DM's Sync unit starts (its log's switch from the Load unit, or the first query-status showing it).",
        "  Checksum: every column of every row, NULL-safe (bench/dm_load.py), the same SQL upstream (MariaDB) and",
        "  downstream (TiDB, any server of a cluster). Proxy recoveries and 1158 from its /metrics, moves from its log;",
        "  TiProxy's migrations from its /metrics (tiproxy_balance_migrate_total), closed connections",
        "  (tiproxy_server_disconnection_total); HAProxy's verdicts from its log (health checks: inter 2 s, fall 3, rise 2).",
    ]
    if has("rates"):
        lines += [
            "  --no-faults: the task paused while the load ran on, then resumed; the sync rate: upstream transactions",
            "  (statements) applied per second from 5 s after the resume to the catch-up, 'applied' meaning written",
            "  upstream before the heartbeat DM had applied (the lag read downstream). Full load: downstream row counts.",
        ]
    return "\n".join(lines)


SUMMARY_HEAD = ("DM", "middle", "safe mode", "faults (full load / sync)", "DM pauses (full load / sync)", "time paused (s)",
                "failed transactions as DM sees them (full load / sync)", "of them 1158", "the proxy's 1158s", "max lag (s)",
                "tables identical")  # fmt: skip


def summary(results: dict[str, Any]) -> str:
    """A Markdown table, one row a run: which DM (its version, +#12078 if it carries the fix),
    through what, and what DM went through."""

    def both(r: dict[str, Any], fn) -> str:
        return f"{fn(r, 'load')} / {fn(r, 'sync')}"

    def cells(r: dict[str, Any]) -> tuple[str, ...]:
        return (build_of(r), column_label(r), "on" if r.get("safe_mode") else "off",
                both(r, restarts_in_phase) + f" {describe_signals(r)}",
                both(r, lambda r, n: phase(r, n).get("pauses", "-")),
                f"{r['dm']['paused_s']:.0f}" + (f" ({r['dm']['never_resumed']} never resumed)" if r["dm"].get("never_resumed") else ""),
                both(r, lambda r, n: phase(r, n).get("failed_txns", "-")),
                str(r["dm"].get("seen_1158", "-")), _outcome(r, "aborted_1158"), lag_max(r),
                "yes" if r["identical"] else "NO")  # fmt: skip

    rows = [SUMMARY_HEAD, tuple("---" for _ in SUMMARY_HEAD), *(cells(r) for r in results["runs"])]
    return "\n".join("| " + " | ".join(row) + " |" for row in rows)


def signals_of(r: dict[str, Any]) -> str:
    return "/".join(sorted({x.get("signal", "SIGTERM") for x in r["restarts"]})) or "-"


def describe_signals(r: dict[str, Any]) -> str:
    """``SIGTERM wait 0,3 s`` or ``SIGKILL``: the run's faults."""
    waits = sorted({x["graceful_wait"] for x in r["restarts"] if x.get("signal", "SIGTERM") == "SIGTERM"})
    return signals_of(r) + (f" wait {','.join(str(w) for w in waits)} s" if waits else "")


def _outcome(r: dict[str, Any], name: str) -> str:
    if not r.get("proxy"):
        return "-"
    return f"{r['proxy']['recoveries'].get(name, 0):.0f}"


def _tiproxy(fn):
    return lambda r: "-" if not r.get("tiproxy") else fn(r["tiproxy"])


def _rate(fn, fmt: str):
    def cell(r) -> str:
        value = fn(r["rates"]) if r.get("rates") else None
        return "-" if value is None else fmt.format(value)

    return cell


HOPS = (("dm_round_trip", "DM's round trip"), ("inbound", "middle, inbound"), ("server", "TiDB's round trip"),
        ("outbound", "middle, outbound"))  # fmt: skip


def _hop(rates: dict[str, Any], key: str) -> str | None:
    """One figure of the drain's packet capture (``--capture-hops``), or None."""
    figures = ((rates.get("backlog") or {}).get("hops") or {}).get(key)
    return None if not figures else f"{figures['mean']:.2f} / {figures['p50']:.2f}"


def _drain_cpu(rates: dict[str, Any], name: str | None) -> float | None:
    """Cores used while DM drained the backlog: the machine's (``name`` None) or one command's."""
    cpu = (rates.get("backlog") or {}).get("cpu")
    if not cpu:
        return None
    return cpu["machine_busy_cores"] if name is None else cpu["cores_by_command"].get(name)


COLORS = {"direct": "#555555", "proxy": "#dd8452", "haproxy": "#4c72b0", "tiproxy": "#55a868"}
TITLES = {"direct": "DM -> TiDB directly", "proxy": "DM -> replay-proxy -> TiDB", "haproxy": "DM -> HAProxy -> TiDB",
          "tiproxy": "DM -> TiProxy -> TiDB"}  # fmt: skip


KIND_COLORS = {"graceful restart": "#4c72b0", "SQL-layer crash": "#c44e52", "partition": "#937860", "lost DDL answer": "#8172b3",
               "idle sessions closed": "#64b5cd", "proxy SIGUSR2": "#55a868", "proxy SIGTERM": "#c44e52"}  # fmt: skip


def write_chart(results: dict[str, Any], path: Path) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no chart"
    runs = results["runs"]
    fig, axes = plt.subplots(len(runs), 1, figsize=(12, 3.2 * len(runs)), sharex=True, squeeze=False)
    for ax, r in zip(axes[:, 0], runs):
        t0 = r["started"]
        xs = [t - t0 for t, v in r["lag"] if v is not None]
        ys = [v for _, v in r["lag"] if v is not None]
        ax.plot(xs, ys, color=COLORS.get(r["target"], "#555555"), lw=1.2, label="lag (s)")
        term = kill = 0
        marked: set[str] = set()
        for x in r["restarts"] + (r.get("proxy_events") or []):
            end = x.get("up") or x.get("down") or x["stop"]
            kind = x.get("kind") or (f"proxy {x['signal']}" if x.get("server") == "proxy" else None)
            if kind is not None:  # the soak's faults and the proxy's own: a colour per kind
                ax.axvspan(x["stop"] - t0, max(end, x["stop"] + 0.5) - t0, color=KIND_COLORS.get(kind, "#999999"), alpha=0.3, lw=0,
                           label=kind if kind not in marked else None)  # fmt: skip
                marked.add(kind)
                continue
            if x.get("signal") == "SIGKILL":
                ax.axvline(x["stop"] - t0, color="#c44e52", lw=1.2, label="SIGKILL" if kill == 0 else None)
                ax.axvspan(x["stop"] - t0, end - t0, color="#c44e52", alpha=0.12, lw=0)
                kill += 1
            else:
                ax.axvspan(x["stop"] - t0, end - t0, color="#4c72b0", alpha=0.15, lw=0,
                           label="SIGTERM .. serving again" if term == 0 else None)  # fmt: skip
                term += 1
            if "index" in x and len({y.get("index") for y in r["restarts"]}) > 1:
                ax.annotate(str(x["index"]), (x["stop"] - t0, 1), xycoords=("data", "axes fraction"), fontsize=6,
                            va="top", ha="left", color="#333333")  # fmt: skip
        for i, (a, _b) in enumerate(r["dm"]["pause_spans"]):
            ax.axvline(a, color="#8172b3", lw=1, ls="--", label="DM paused" if i == 0 else None)
        backlog = (r.get("rates") or {}).get("backlog") or {}
        if backlog.get("paused_at") and backlog.get("resumed_at"):
            ax.axvspan(backlog["paused_at"] - t0, backlog["resumed_at"] - t0, color="#999999", alpha=0.2, lw=0, label="task paused (bench)")
        ax.axvline(r["ended"] - t0, color="#333333", lw=1, ls=":", label="load stopped (then the heartbeat stands still)")
        ax.set_ylabel("lag (s)")
        loaded = [v for t, v in r["lag"] if v is not None and t <= r["ended"]]
        title = TITLES.get(r["target"], r["target"]).replace("DM", f"DM {build_of(r)}", 1) + (" (safe mode)" if r.get("safe_mode") else "")
        if str(r.get("downstream", "")).startswith("cluster"):
            title += f" ({r['downstream']})"
        ax.set_title(f"{title}: {r['dm']['pauses']} pauses, max lag {max(loaded) if loaded else 0:.0f} s while the load ran, "
                     f"{len(r['restarts'])} restarts", fontsize=10)  # fmt: skip
        ax.legend(loc="upper left", fontsize=8)
    axes[-1, 0].set_xlabel("seconds since start-task (restarts numbered by server)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


def unavailable(args: argparse.Namespace) -> list[str]:
    """Why this run cannot happen here (missing binaries), one line each."""
    reasons = [tidb_unavailable_reason(), None if args.dm_bin else dm_unavailable_reason()]
    if args.cluster:
        reasons.append(cluster_unavailable_reason())
    if "tiproxy" in middles(args):
        reasons.append(tiproxy_unavailable_reason())
    if "haproxy" in middles(args):
        from bench.haproxy import haproxy_unavailable_reason

        reasons.append(haproxy_unavailable_reason())
    return [r for r in reasons if r]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sigterm_as_interrupt()
    if args.pin_tidb is not None:  # every process started from here on inherits the rest
        _os.sched_setaffinity(0, _os.sched_getaffinity(0) - args.tidb_cpus)
    for reason in unavailable(args):
        print(f"bench.dm_e2e: {reason}", file=sys.stderr)
    if unavailable(args):
        return 2
    now = _dt.datetime.now()
    out = (args.out or REPO / "bench" / "results" / f"{now:%Y%m%d-%H%M%S}-dm_e2e").resolve()
    out.mkdir(parents=True, exist_ok=True)

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)

    try:
        builds = dm_builds.probe_all(args.dm_bin)
        runs = dm_builds.plan_runs(builds, args.targets, args.safe_modes)
    except ValueError as exc:
        print(f"bench.dm_e2e: {exc}", file=sys.stderr)
        return 2
    settings = vars(args) | {"out": str(out), "dm_builds": [b.to_json() for b in builds]}
    results: dict[str, Any] = {"meta": run_meta(now, "bench.dm_e2e", argv, settings=settings), "runs": []}
    for build in builds:
        log(f"DM {build.label}: {build.description} (commit {build.commit[:10]}), {build.folder or 'the lab default'}")
    for spec in runs:
        log(f"{spec.name} (DM {spec.build.description}, {spec.target}, safe mode {'on' if spec.safe_mode else 'off'}): "
            f"fresh lab in {out / spec.name}")  # fmt: skip
        results["runs"].append(run_target(spec, args, out / spec.name, log))
        (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    table, runs_md = render(results), summary(results)
    (out / "table.txt").write_text(table + "\n")
    (out / "summary.md").write_text(runs_md + "\n")
    problem = write_chart(results, out / "lag.png")
    print(table)
    print(f"\n{runs_md}")
    print(f"\nresults: {out}" + (f" ({problem})" if problem else ""))
    return 0 if all(r["identical"] for r in results["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())

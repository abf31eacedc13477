"""The command line: replay-proxy --config configs/<target>.toml runs the proxy of one
target database; replay-proxy status --config configs/<target>.toml prints the running
proxy's /status as a table (exit 1 when it is not ready); replay-proxy check --config
configs/<target>.toml logs in to every backend address and reports what would bite at run
time (exit 1 on any problem); replay-proxy upgrade --config configs/<target>.toml asks the
running proxy (at the admin address of that file) to hand over to a new process of the code
and config now on disk (exit 1, with the reason, when the new one cannot start: the running
one keeps serving); --check validates the config file alone and exits.

Signals: SIGTERM or SIGINT drains (sessions close between transactions, the rest after
listen.drain_timeout); SIGHUP reloads the config file (an invalid one is rejected and the
running config kept); SIGUSR2 upgrades, as the upgrade command does (the outcome in the log). Every
key is documented in configs/example.toml.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import signal
import socket
import stat
import sys
import time
import urllib.error
import urllib.request
from importlib.metadata import PackageNotFoundError, version

import trio

from proxy import corebuild, hostloop
from proxy.config import Address, Config, ConfigError, load_config
from proxy.handover.protocol import HandoverError
from proxy.sessionlog import FIELDS
from proxy.tls import check_files
from proxy.workers import MAX_WORKERS, WorkerInfo, supervise, supervisor_reexecuted, watch_supervisor

__all__ = ["main", "run"]

log = logging.getLogger("replay_proxy")


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for name in FIELDS:  # what a record carries (extra=, a SessionLog) as fields of their own
            value = getattr(record, name, None)
            if value is not None:
                out[name] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


def setup_logging(config: Config, worker=None) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if config.log.format == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        where = f"[worker {worker.index}] " if worker is not None else ""
        handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s {where}%(name)s: %(message)s"))
    root = logging.getLogger("replay_proxy")
    root.handlers[:] = [handler]
    root.setLevel(config.log.level.upper())
    root.propagate = False


async def run(config: Config, path: str | None = None, worker=None, successor=None, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Run the proxy (and its admin endpoint) until cancelled or SIGTERM/SIGINT; SIGHUP
    reloads ``path``; SIGUSR2 upgrades. ``worker``: this process is one of several
    (``proxy.workers``); ``successor``: it takes over from an old process
    (``proxy.handover.upgrade.Successor``), whose listeners it adopts."""
    from proxy.frontend import Proxy
    from proxy.plugin_loader import load_chain

    hooks = load_chain(config)
    proxy = Proxy(config, hooks, worker=worker)
    retired: list = []  # plugin chains replaced by a reload, closed at exit
    try:
        await _serve(config, hooks, proxy, path, retired, task_status, successor)
    finally:
        for chain in [proxy.target.hooks, *retired]:
            chain.close()  # plugins flush and close their files


_HANDED_OVER = "handed over"  # the event of an upgrade done: the new process serves


async def _serve(config: Config, hooks, proxy, path: str | None, retired: list, task_status, successor=None) -> None:
    from proxy.admin import open_listeners, serve_admin
    from proxy.handover import sdnotify
    from proxy.handover.sessions import move_sessions, take_over
    from proxy.handover.upgrade import Upgrader, upgrade_logged

    # The signals are caught before anything starts: a SIGTERM while starting (a supervisor
    # stopping a worker it just restarted) is a drain like any other, not a silent death.
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR2) as signals:
        async with trio.open_nursery() as nursery:
            inherited = await successor.take_listeners() if successor is not None else None
            if inherited is not None:
                proxy.ids_above(inherited.next_session_id - 1)  # the old process's sessions keep theirs when they move

            def take(role: str, address: Address) -> list | None:
                return inherited.take(role, str(address)) if inherited is not None else None

            admin_address = None
            if proxy.worker is not None:  # a worker's private admin port: the supervisor gathers it
                admin_address = Address("127.0.0.1", proxy.worker.admin_ports[proxy.worker.index])
            elif config.admin.enabled:
                admin_address = config.admin_address
            # Every socket is open before the first client is accepted: a new process that
            # cannot bind a changed admin address fails before it has taken any client.
            await proxy.listen(take("client", config.listen.address))
            admin_listeners = await open_listeners(config, admin_address, take("admin", admin_address)) if admin_address else []
            addresses = await nursery.start(proxy.serve)
            # A worker's upgrade is asked for by its supervisor (POST /upgrade on the private port).
            upgrader = Upgrader(path, lambda: _listening(proxy, admin_address, admin_listeners), lambda: len(proxy.target.sessions),
                                proxy.next_session_id, _upgrade_args(config, proxy.worker), proxy.target.stats.upgrade_failed)  # fmt: skip
            admin_stopped = trio.Event()  # set when the admin listener is handed over
            if admin_listeners:
                await nursery.start(functools.partial(serve_admin, config, hooks, proxy, admin_address, listeners=admin_listeners,
                                                      stop=admin_stopped, upgrader=upgrader))  # fmt: skip
            if inherited is not None:
                wanted = [f"client {config.listen.address}"] + ([f"admin {admin_address}"] if admin_address else [])
                bound = [name for name in wanted if name not in inherited.adopted]
                closed = inherited.close_rest()
                log.info("took over from pid %d: listeners adopted: %s; bound anew: %s; closed (no longer configured): %s",
                         inherited.old_pid, ", ".join(inherited.adopted) or "none", ", ".join(bound) or "none",
                         ", ".join(closed) or "none", extra={"event": "upgrade_took_over"})  # fmt: skip
                nursery.start_soon(take_over, successor, inherited, bound, closed, proxy)
            elif proxy.worker is None:
                sdnotify.notify("READY=1")  # a Type=notify unit: the proxy serves
            if proxy.worker is not None and os.getppid() != proxy.worker.supervisor_pid:
                nursery.start_soon(watch_supervisor, proxy.worker.supervisor_pid)  # started by the worker it replaces
            if proxy.worker is not None and config.listen.takeover:  # the supervisor keeps this worker's clients
                from proxy.handover.mirror import Mirror

                proxy.mirror = Mirror(proxy, proxy.worker.supervisor_pid, proxy.worker.index)
                await nursery.start(proxy.mirror.run)
            task_status.started(addresses)
            events_in, events = trio.open_memory_channel(16)
            nursery.start_soon(_forward_signals, signals, events_in)
            nursery.start_soon(_when_set, upgrader.handed_over, events_in, _HANDED_OVER)
            async for event in events:
                if event == signal.SIGHUP:
                    reload(proxy, path, retired)
                    continue
                if event == signal.SIGUSR2:
                    if proxy.worker is not None:
                        log.warning("SIGUSR2 ignored: a worker is upgraded through its supervisor: send SIGUSR2 to pid %d, "
                                    "which upgrades every worker in turn", proxy.worker.supervisor_pid)  # fmt: skip
                    else:
                        nursery.start_soon(upgrade_logged, upgrader, "SIGUSR2")
                    continue
                if event == _HANDED_OVER:
                    admin_stopped.set()  # the new process answers the admin endpoint from now on
                    await move_sessions(proxy, upgrader)
                    await proxy.drain()
                    log.info("upgrade: pid %d drained, exiting; pid %d serves", os.getpid(), upgrader.outcome.new_pid)
                else:
                    log.info("received %s; %d session(s) open", signal.Signals(event).name, len(proxy.target.sessions))
                    upgrader.abandon()  # a new process half started must not outlive this one
                    await proxy.drain()
                nursery.cancel_scope.cancel()
                break


def _listening(proxy, admin_address: Address | None, admin_listeners: list) -> list:
    """What an upgrade hands over: the client listeners and the admin endpoint's."""
    from proxy.handover.upgrade import Listening

    out = [Listening("client", str(proxy.listen_address), [lst.socket.fileno() for lst in proxy.listeners])]
    if admin_listeners:
        out.append(Listening("admin", str(admin_address), [lst.socket.fileno() for lst in admin_listeners]))
    return out


def _upgrade_args(config: Config, worker: WorkerInfo | None) -> list[str]:
    """A worker's successor is the same worker of the same supervisor. A single process whose
    config asks for workers was started with --workers 1: so is the new one (a config that asks
    for workers now is refused by the new process)."""
    if worker is not None:
        return worker.arguments(worker.supervisor_pid)
    return ["--workers", "1"] if config.listen.workers > 1 else []


async def _forward_signals(signals, events) -> None:
    async for signum in signals:
        await events.send(signum)


async def _when_set(event: trio.Event, events, what: str) -> None:
    await event.wait()
    await events.send(what)


# What a reload cannot change while running.
_RESTART_ONLY = (
    ("listen", "address"),
    ("listen", "tls"),
    ("listen", "workers"),
    ("listen", "takeover"),
    ("listen", "fast_lane"),
    ("admin", "address"),
    ("admin", "enabled"),
    ("log", "format"),
)


def reload(proxy, path: str | None, retired: list) -> bool:
    """SIGHUP: load the file again and apply it; an invalid file changes nothing."""
    from proxy.plugin_loader import load_chain

    if path is None:
        log.warning("SIGHUP ignored: no config file to reload")
        proxy.target.stats.reloaded(False)
        return False
    old = proxy.config
    try:
        new = load_config(path)
        check_files(new)
        hooks = load_chain(new)
        proxy.target.stats.check_chain(hooks)  # no plugin metric clashes with the proxy's or another's
    except ConfigError as exc:
        proxy.target.stats.reloaded(False)
        log.error(
            "config reload rejected, the running config is kept: %s",
            str(exc).replace(":\n", ": ").replace("\n", "; "),
            extra={"event": "reload_rejected"},
        )
        return False
    restart = [".".join(k) for k in _RESTART_ONLY if getattr(getattr(old, k[0]), k[1]) != getattr(getattr(new, k[0]), k[1])]
    retired.append(proxy.target.hooks)
    proxy.reload(new, hooks)
    proxy.target.stats.reloaded(True)
    logging.getLogger("replay_proxy").setLevel(new.log.level.upper())
    log.info("config reloaded from %s: users, plugins, limits, recovery and backends apply to new sessions and new "
             "backend connections%s", path, f"; needs a restart to change: {', '.join(restart)}" if restart else "",
             extra={"event": "reload"})  # fmt: skip
    return True


def _warn_if_readable(path: str, config: Config) -> None:
    """Passwords in a file other users can read deserve a warning (at start, never fatal)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if mode & (stat.S_IRGRP | stat.S_IROTH) and any(u.password or u.backend_password for u in config.users):
        log.warning("%s holds passwords and is readable by other users (mode %o): chmod 600 it, or use password_env",
                    path, stat.S_IMODE(mode))  # fmt: skip


def _version() -> str:
    try:
        return version("replay-proxy")
    except PackageNotFoundError:
        return "unknown"


def status(config: Config, path: str = "configs/<target>.toml") -> int:
    """``replay-proxy status``: the admin endpoint's /status as a table."""
    address = config.admin_address
    url = f"http://{address}/status"
    if not config.admin.enabled:
        print(f"replay-proxy: target {config.name} has no admin endpoint ([admin] enabled = false), so there is no "
              "status to read: set enabled = true (or remove the line) and restart the proxy", file=sys.stderr)  # fmt: skip
        return 1
    request = urllib.request.Request(url)
    token = config.admin.resolved_token()
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            data = json.load(response)
    except (OSError, ValueError) as exc:
        print(f"replay-proxy: {_status_failure(exc, url, config, path)}", file=sys.stderr)
        return 1
    ready = bool(data.get("ready"))
    print(f"target {data['target']}: {'ready' if ready else 'NOT READY'}")
    print(f"{'BACKEND':<24} {'STATE':<9} {'SINCE':>8}  ERROR")
    for b in data["backends"]:
        print(f"{b['address']:<24} {b['state']:<9} {b['since_s']:>7}s  {b['error'] or ''}")
    print(f"{'SESSION':<11} {'USER':<12} {'CLIENT':<22} {'BACKEND':<22} {'TX':<3} {'CMDS':>7} {'RECOV':>5} {'AGE':>8}")
    for sn in data["sessions"]:
        print(f"{sn['id']:<11} {sn['user']:<12} {sn['client']:<22} {sn['backend']:<22} {'yes' if sn['in_transaction'] else '-':<3} "
              f"{sn['commands']:>7} {sn['recoveries']:>5} {sn['opened_s_ago']:>7}s")  # fmt: skip
    totals = data["totals"]
    print("recoveries: " + ", ".join(f"{k} {v}" for k, v in totals["recoveries"].items())
          + f"; replayed statements {totals['replayed_statements']}; failed logins {totals['logins_failed']}")  # fmt: skip
    if not ready:
        print(f"replay-proxy: target {config.name} is not ready: no backend address is up (the BACKEND table: down, draining, or not checked yet); "
              f"replay-proxy check --config {path} tells why", file=sys.stderr)  # fmt: skip
        return 1
    return 0


def upgrade(config: Config, path: str) -> int:
    """``replay-proxy upgrade``: POST /upgrade to the proxy at the admin address of ``path``; it
    starts the code and config now on disk and hands over (exit 1 with the reason if not)."""
    from proxy.handover.upgrade import START_TIMEOUT

    if not config.admin.enabled:
        print(f"replay-proxy: target {config.name} has no admin endpoint ([admin] enabled = false) to ask for the upgrade: "
              "send SIGUSR2 to the proxy's pid instead (the outcome is in its log)", file=sys.stderr)  # fmt: skip
        return 1
    url = f"http://{config.admin_address}/upgrade"
    request = urllib.request.Request(url, data=b"", method="POST")
    token = config.admin.resolved_token()
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    timeout = (START_TIMEOUT + 30) * config.listen.workers  # --workers N: one worker after the other
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            data = json.load(response)
    except urllib.error.HTTPError as exc:
        answer = _json_or_none(exc)
        if exc.code in (409, 500) and answer is not None and "error" in answer:
            print(f"replay-proxy: upgrade of target {config.name} failed; pid {answer.get('pid')} keeps serving: {answer['error']}",
                  file=sys.stderr)  # fmt: skip
        elif exc.code in (404, 405):
            print(f"replay-proxy: {url} does not serve POST /upgrade: the proxy is a version without it; restart it instead",
                  file=sys.stderr)  # fmt: skip
        else:
            print(f"replay-proxy: {_status_failure(exc, url, config, path)}", file=sys.stderr)
        return 1
    except TimeoutError:
        print(f"replay-proxy: {url} gave no answer within {timeout:g} s: the upgrade may still be under way; look at the proxy's log",
              file=sys.stderr)  # fmt: skip
        return 1
    except (OSError, ValueError) as exc:
        print(f"replay-proxy: {_status_failure(exc, url, config, path)}", file=sys.stderr)
        return 1
    if "workers" in data:  # --workers N: the supervisor re-executes itself, the workers hand over
        print(f"target {config.name}: upgraded in {data['seconds']}s, supervisor pid {data['old_pid']} re-executes itself")
        for w in data["workers"]:
            print(f"  worker {w['worker']}: pid {w['old_pid']} -> pid {w['new_pid']}; {w['sessions_left_to_drain']} session(s) "
                  f"left to drain in pid {w['old_pid']}")  # fmt: skip
        return 0
    print(f"target {config.name}: upgraded in {data['seconds']}s, pid {data['old_pid']} -> pid {data['new_pid']}; listeners handed "
          f"over: {', '.join(data['listeners']) or 'none'}; {data['sessions_left_to_drain']} session(s) left to drain in pid "
          f"{data['old_pid']}")  # fmt: skip
    return 0


def _json_or_none(response) -> dict | None:
    try:
        data = json.load(response)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _status_failure(exc: BaseException, url: str, config: Config, path: str) -> str:
    """Why ``replay-proxy status`` got nothing, as a sentence with the next step."""
    where = f"{url} (the admin endpoint of target {config.name})"
    if isinstance(exc, urllib.error.HTTPError):
        if exc.code == 401:
            return (f"{where} refused the request (401): the token is wrong or missing; set the same "
                    "admin.token or admin.token_env as the running proxy")  # fmt: skip
        return f"{where} answered HTTP {exc.code} {exc.reason}: see the proxy's log"
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, ConnectionRefusedError):
        return (f"nothing answers at {where}: connection refused. The proxy is not running, or runs with another "
                f"[admin] address: start it with replay-proxy --config {path}, or give status the file it runs with")  # fmt: skip
    if isinstance(reason, (TimeoutError, socket.timeout)):
        return f"{where} did not answer within 5 s: the proxy may be overloaded or stopped; look at its log, then try again"
    if isinstance(exc, ValueError):
        return f"{where} answered something that is not JSON ({exc}): is another program on that port?"
    text = getattr(reason, "strerror", None) or str(reason)
    return f"cannot reach {where}: {text}; check that the proxy is running with this config"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="replay-proxy", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("command", nargs="?", choices=["run", "status", "check", "upgrade"], default="run",
                        help="run the proxy (default); print a running proxy's status (exit 1 when not ready); check "
                             "the target: log in to every backend address and report what would bite (exit 1 on a problem); "
                             "or upgrade the running proxy: a new process of the code and config on disk takes over its "
                             "listeners (exit 1 with the reason when it cannot start)")  # fmt: skip
    parser.add_argument("--config", help="TOML file of the target database (configs/<target>.toml)")
    parser.add_argument("--check", action="store_true", help="validate the config and exit (no side effects)")
    parser.add_argument("--version", action="version", version=f"replay-proxy {_version()} (sans-IO core: {corebuild.mode()})")
    parser.add_argument("--workers", type=int, metavar="N",
                        help="processes sharing the listen port (default: listen.workers, 1)")  # fmt: skip
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # i/N: started by the supervisor
    parser.add_argument("--worker-admin", help=argparse.SUPPRESS)  # every worker's private admin port
    parser.add_argument("--supervisor-pid", type=int, help=argparse.SUPPRESS)  # the worker's supervisor
    parser.add_argument("--handover-fd", type=int, help=argparse.SUPPRESS)  # started by an upgrade (proxy.handover)
    args = parser.parse_args(argv)
    if not args.config:
        parser.error("--config is required: give the TOML file of the target, for example --config configs/dm-sidecar.toml")
    successor = None
    if args.handover_fd is not None:
        from proxy.handover.upgrade import Successor

        try:
            successor = Successor.from_fd(args.handover_fd)
        except HandoverError as exc:
            print(f"replay-proxy: {exc}", file=sys.stderr)
            return 2
    remote = args.command in ("status", "upgrade")  # they need the admin address and token only
    try:
        # no user passwords from the environment for status and upgrade (the new process reads them)
        config = load_config(args.config, secrets=not remote)
        from proxy.plugin_loader import check_chain

        if not remote:
            check_files(config)  # the TLS certificates and keys load
        check_chain(config)  # plugin names and options are part of the config check
    except ConfigError as exc:
        print(f"replay-proxy: {exc}", file=sys.stderr)
        _tell_old_process(successor, str(exc))  # it names the file
        return 2
    if args.command == "status":
        return status(config, args.config)
    if args.command == "upgrade":
        return upgrade(config, args.config)
    if args.command == "check":
        from proxy.preflight import run as preflight

        return trio.run(preflight, config, args.config)
    if args.check:
        print(f"{args.config}: ok (target {config.name})")
        return 0
    worker = WorkerInfo.parse(args.worker, args.worker_admin, args.supervisor_pid or os.getppid()) if args.worker else None
    setup_logging(config, worker)
    if worker is None:
        if not supervisor_reexecuted():  # said once, when the operator started it
            _warn_if_readable(args.config, config)
        workers = args.workers if args.workers is not None else config.listen.workers
        if not 1 <= workers <= MAX_WORKERS:
            print(f"replay-proxy: --workers must be 1 to {MAX_WORKERS}, got {workers}", file=sys.stderr)
            return 2
        if workers > 1 and successor is not None:
            reason = (f"{args.config} asks for {workers} worker processes (listen.workers): an upgrade cannot go from one "
                      "process to several yet; restart the proxy instead")  # fmt: skip
            log.error("cannot take over: %s", reason)
            _tell_old_process(successor, reason)
            return 2
        if workers > 1:
            return supervise(config, args.config, workers)
    try:
        # A worker whose supervisor keeps its clients writes every step of a session to its
        # record: the slow lane's, under trio alone (the host loop would only add its wakes).
        hosted = config.listen.fast_lane and (worker is None or not config.listen.takeover)
        hostloop.run(run, config, args.config, worker, successor, hosted=hosted)
    except KeyboardInterrupt:
        pass
    except (ConfigError, OSError, HandoverError, BaseExceptionGroup) as exc:
        cause = _start_failure(exc)
        if cause is None:
            _tell_old_process(successor, f"internal error: {type(exc).__name__}: {exc} (the traceback is in the log)")
            raise
        log.error("cannot start target %s: %s", config.name, cause)
        _tell_old_process(successor, f"cannot start target {config.name}: {_one_line(cause)}")
        if isinstance(cause, ConfigError):  # a plugin that fails to build (its log file, ...)
            return 2
        return 1
    except BaseException as exc:
        _tell_old_process(successor, f"internal error: {type(exc).__name__}: {exc} (the traceback is in the log)")
        raise
    return 0


def _tell_old_process(successor, reason: str) -> None:
    """A new process of an upgrade that cannot start: the old one keeps serving and says why."""
    if successor is not None:
        successor.failed(_one_line(reason))


def _one_line(reason: object) -> str:
    return str(reason).replace(":\n", ": ").replace("\n", "; ")


def _start_failure(exc: BaseException) -> BaseException | None:
    """The ConfigError, OSError (a busy port, ...) or hand-over error behind a failed start, if
    that is what it is: one clear line instead of a traceback."""
    if isinstance(exc, (ConfigError, OSError, HandoverError)):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for sub in exc.exceptions:
            found = _start_failure(sub)
            if found is not None:
                return found
    return None

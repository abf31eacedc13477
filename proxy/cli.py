"""The command line: replay-proxy --config configs/<target>.toml runs the proxy of one
target database; replay-proxy status --config configs/<target>.toml prints the running
proxy's /status as a table (exit 1 when it is not ready); replay-proxy check --config
configs/<target>.toml logs in to every backend address and reports what would bite at run
time (exit 1 on any problem); --check validates the config file alone and exits.

Signals: SIGTERM or SIGINT drains (sessions close between transactions, the rest after
listen.drain_timeout); SIGHUP reloads the config file (an invalid one is rejected and the
running config kept). Every key is documented in configs/example.toml.
"""

from __future__ import annotations

import argparse
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

from proxy.config import Address, Config, ConfigError, load_config
from proxy.sessionlog import FIELDS
from proxy.tls import check_files
from proxy.workers import MAX_WORKERS, WorkerInfo, supervise

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


async def run(config: Config, path: str | None = None, worker=None, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Run the proxy (and its admin endpoint) until cancelled or SIGTERM/SIGINT; SIGHUP
    reloads ``path``. ``worker``: this process is one of several (``proxy.workers``)."""
    from proxy.frontend import Proxy
    from proxy.plugin_loader import load_chain

    hooks = load_chain(config)
    proxy = Proxy(config, hooks, worker=worker)
    retired: list = []  # plugin chains replaced by a reload, closed at exit
    try:
        await _serve(config, hooks, proxy, path, retired, task_status)
    finally:
        for chain in [proxy.target.hooks, *retired]:
            chain.close()  # plugins flush and close their files


async def _serve(config: Config, hooks, proxy, path: str | None, retired: list, task_status) -> None:
    from proxy.admin import serve_admin

    # The signals are caught before anything starts: a SIGTERM while starting (a supervisor
    # stopping a worker it just restarted) is a drain like any other, not a silent death.
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT, signal.SIGHUP) as signals:
        async with trio.open_nursery() as nursery:
            addresses = await nursery.start(proxy.serve)
            if proxy.worker is not None:  # a worker's private admin port: the supervisor gathers it
                worker = proxy.worker
                await nursery.start(serve_admin, config, hooks, proxy, Address("127.0.0.1", worker.admin_ports[worker.index]))
            elif config.admin.enabled:
                await nursery.start(serve_admin, config, hooks, proxy)
            task_status.started(addresses)
            async for signum in signals:
                if signum == signal.SIGHUP:
                    reload(proxy, path, retired)
                    continue
                log.info("received %s; %d session(s) open", signal.Signals(signum).name, len(proxy.target.sessions))
                await proxy.drain()
                nursery.cancel_scope.cancel()
                break


# What a reload cannot change while running.
_RESTART_ONLY = (
    ("listen", "address"),
    ("listen", "tls"),
    ("listen", "workers"),
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
    parser.add_argument("command", nargs="?", choices=["run", "status", "check"], default="run",
                        help="run the proxy (default); print a running proxy's status (exit 1 when not ready); or check "
                             "the target: log in to every backend address and report what would bite (exit 1 on a problem)")  # fmt: skip
    parser.add_argument("--config", help="TOML file of the target database (configs/<target>.toml)")
    parser.add_argument("--check", action="store_true", help="validate the config and exit (no side effects)")
    parser.add_argument("--version", action="version", version=f"replay-proxy {_version()}")
    parser.add_argument("--workers", type=int, metavar="N",
                        help="processes sharing the listen port (default: listen.workers, 1)")  # fmt: skip
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # i/N: started by the supervisor
    parser.add_argument("--worker-admin", help=argparse.SUPPRESS)  # every worker's private admin port
    args = parser.parse_args(argv)
    if not args.config:
        parser.error("--config is required: give the TOML file of the target, for example --config configs/dm-sidecar.toml")
    try:
        # status needs the admin address and token only: no user passwords from the environment
        config = load_config(args.config, secrets=args.command != "status")
        from proxy.plugin_loader import check_chain

        if args.command != "status":
            check_files(config)  # the TLS certificates and keys load
        check_chain(config)  # plugin names and options are part of the config check
    except ConfigError as exc:
        print(f"replay-proxy: {exc}", file=sys.stderr)
        return 2
    if args.command == "status":
        return status(config, args.config)
    if args.command == "check":
        from proxy.preflight import run as preflight

        return trio.run(preflight, config, args.config)
    if args.check:
        print(f"{args.config}: ok (target {config.name})")
        return 0
    worker = WorkerInfo.parse(args.worker, args.worker_admin) if args.worker else None
    setup_logging(config, worker)
    if worker is None:
        _warn_if_readable(args.config, config)
        workers = args.workers if args.workers is not None else config.listen.workers
        if not 1 <= workers <= MAX_WORKERS:
            print(f"replay-proxy: --workers must be 1 to {MAX_WORKERS}, got {workers}", file=sys.stderr)
            return 2
        if workers > 1:
            return supervise(config, args.config, workers)
    try:
        trio.run(run, config, args.config, worker)
    except KeyboardInterrupt:
        pass
    except (ConfigError, OSError, BaseExceptionGroup) as exc:
        cause = _start_failure(exc)
        if cause is None:
            raise
        if isinstance(cause, ConfigError):  # a plugin that fails to build (its log file, ...)
            log.error("cannot start target %s: %s", config.name, cause)
            return 2
        log.error("cannot start target %s: %s", config.name, cause)
        return 1
    return 0


def _start_failure(exc: BaseException) -> BaseException | None:
    """The ConfigError or OSError (a busy port, ...) behind a failed start, if that is what it is:
    one clear line instead of a traceback."""
    if isinstance(exc, (ConfigError, OSError)):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for sub in exc.exceptions:
            found = _start_failure(sub)
            if found is not None:
                return found
    return None

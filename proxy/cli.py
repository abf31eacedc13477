"""Command line: ``replay-proxy --config configs/<target>.toml``."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import time

import trio

from proxy.config import Config, ConfigError, load_config

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
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


def setup_logging(config: Config) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if config.log.format == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("replay_proxy")
    root.handlers[:] = [handler]
    root.setLevel(config.log.level.upper())
    root.propagate = False


async def run(config: Config, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Run the proxy (and its admin endpoint) until cancelled or SIGTERM/SIGINT."""
    from proxy.frontend import Proxy
    from proxy.plugin_loader import load_chain

    hooks = load_chain(config)
    proxy = Proxy(config, hooks)
    try:
        await _serve(config, hooks, proxy, task_status)
    finally:
        hooks.close()  # plugins flush and close their files


async def _serve(config: Config, hooks, proxy, task_status) -> None:
    from proxy.admin import serve_admin

    async with trio.open_nursery() as nursery:
        addresses = await nursery.start(proxy.serve)
        if config.admin.enabled:
            await nursery.start(serve_admin, config, hooks, proxy)
        task_status.started(addresses)
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                log.info("received %s; %d session(s) open", signal.Signals(signum).name, len(proxy.target.sessions))
                await proxy.drain()
                nursery.cancel_scope.cancel()
                break


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="replay-proxy", description=__doc__)
    parser.add_argument("--config", required=True, help="TOML file of the target database (configs/<target>.toml)")
    parser.add_argument("--check", action="store_true", help="validate the config and exit")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
        from proxy.plugin_loader import load_chain

        load_chain(config)  # plugin names and options are part of the config check
    except ConfigError as exc:
        print(f"replay-proxy: configuration error in {exc}", file=sys.stderr)
        return 2
    if args.check:
        print(f"{args.config}: ok (target {config.name})")
        return 0
    setup_logging(config)
    try:
        trio.run(run, config)
    except KeyboardInterrupt:
        pass
    except OSError as exc:
        log.error("cannot start: %s", exc)
        return 1
    return 0

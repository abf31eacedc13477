"""The proxy with a trio Instrument installed: ``python -m bench.instrumented_proxy --config F --counts J``.

What ``python -m proxy --config F`` does (load and check the config, set up logging,
``trio.run(proxy.cli.run, config, path)``), plus ``instruments=[LoopCounter()]``
(bench/instrument.py): task steps and I/O waits are counted, written to ``J`` on SIGUSR1 (the
benchmark's snapshot before and after each run) and at exit (SIGTERM drains and ends the proxy
as usual). One process only: ``--workers`` is not supported here.
"""

from __future__ import annotations

import argparse
import inspect
import sys
from pathlib import Path

import trio


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.instrumented_proxy", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", required=True)
    p.add_argument("--counts", type=Path, required=True, help="JSON file the counts are written to")
    args = p.parse_args(argv)

    from bench.instrument import LoopCounter, dump_on_signal
    from proxy.cli import run, setup_logging
    from proxy.config import ConfigError, load_config

    try:
        from proxy.plugin_loader import check_chain
    except ImportError:  # older versions check plugins when the chain is loaded
        check_chain = None
    try:
        config = load_config(args.config)
        if check_chain is not None:
            check_chain(config)
    except ConfigError as exc:
        print(f"instrumented proxy: configuration error in {exc}", file=sys.stderr)
        return 2
    setup_logging(config)
    counter = LoopCounter()
    dump_on_signal(counter, args.counts)
    try:
        # proxy.cli.run(config, path) reloads ``path`` on SIGHUP; older versions take no path.
        run_args = (config, args.config) if "path" in inspect.signature(run).parameters else (config,)
        trio.run(run, *run_args, instruments=[counter])
    except KeyboardInterrupt:
        pass
    finally:
        counter.dump(args.counts, final=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

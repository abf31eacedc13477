"""DM's other paths through replay-proxy while the TiDB cluster restarts: one shard, one
dm-worker, one sidecar (bench/dm_shards.py's lab), a mode of DM's each run.

    python -m bench.dm_paths [--paths online-ddl,validator,relay,compact,loader-replace]
                             [--targets proxy,direct] [--faults rolling] [--duration 120]
                             [--general-log]

- ``online-ddl``: the task's ``online-ddl: true``, and pt-online-schema-change (Debian's
  percona-toolkit) changing ``orders`` and then ``order_items`` upstream under the load (a
  shadow table ``_<t>_new`` filled in chunks while triggers copy the load's changes, then
  renamed in its place): DM replays the shadow table's DDL on the real table and drops the
  shadow's rows;
- ``validator``: DM's continuous validator in ``full`` mode (``validators``), which reads the
  downstream rows it compares with the binlog all the time, through the proxy (without the
  ADD COLUMNs: DM's validator cannot check rows from both sides of one, ``CHANGES_COLUMNS``);
- ``relay``: the source's ``enable-relay: true`` (DM reads its own copy of the binlog);
- ``compact``: ``syncers.compact`` and ``multiple-rows`` (DM merges a key's changes and writes
  multi-row INSERT / REPLACE / ``INSERT ... ON DUPLICATE KEY UPDATE`` / DELETE ... IN);
- ``loader-replace``: the full load with ``loaders.on-duplicate-logical: replace`` (the lab's
  setting in every run) under faults, with a bigger preload (``--load-scale``), which DM
  resumes after a pause from its checkpoint, replacing what is there. Here the default 60,000
  orders load in ~5 s, before the first fault (``--interval`` after the start): for faults
  inside the load, ``--paths loader-replace --load-scale 150000 --interval 4`` (~19 s of load,
  4 restarts in it).

Every run also applies bench/dm_shards.py's ADD COLUMN / ADD INDEX / MODIFY COLUMN (plain DDL,
one shard). Counted as there: pauses, failed batches, the proxy's recoveries and 1158s, lag,
identical tables (NULL-safe checksums); ``--general-log`` writes DM's statements, one per shape,
as TiDB's general log has them (``dm_statements-<run>.jsonl``: take them from ``direct`` runs,
where no statement of the proxy's own is among DM's). ``--corpus RESULTS_DIR ...`` merges those
of the ``direct`` runs into the DM SQL corpus (one line a shape: an example, how often it came,
in which paths; tests/corpus/dm_v855_paths.jsonl, judged by tests/unit/test_dm_corpus.py):

    python -m bench.dm_paths --corpus bench/results/<run> > tests/corpus/dm_v855_paths.jsonl
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench.dm_e2e import statement_shape
from bench.dm_shards import Setup, lab_arguments, main_loop

PT_OSC = "pt-online-schema-change"


@dataclass(frozen=True)
class OnlineChange:
    """pt-online-schema-change altering ``table`` of the first shard (a ShardLoad statement)."""

    table: str
    alter: str

    def __str__(self) -> str:
        return f"{PT_OSC} --alter '{self.alter}' t={self.table}"

    def __call__(self, ports: list[int]) -> str:
        command = [PT_OSC, "--alter", self.alter, "--execute", "--recursion-method=none", "--no-check-replication-filters",
                   "--chunk-size=500", f"D=shop_1,t={self.table},h=127.0.0.1,P={ports[0]},u=root"]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise RuntimeError(f"exit {done.returncode}: {(done.stdout + done.stderr)[-300:]}")
        return "ok"


ONLINE_CHANGES = [
    (0.3, OnlineChange("orders", "ADD COLUMN gift_wrap TINYINT NOT NULL DEFAULT 0")),
    (0.45, OnlineChange("orders", "ADD INDEX idx_created (created)")),
    (0.6, OnlineChange("order_items", "MODIFY COLUMN price DECIMAL(12,2) NOT NULL")),
]
# DM's validator (v8.5.5, and tiflow master) checks a table's pending rows in batches read with
# the columns of the batch's first row (dm/syncer/validate_worker.go batchValidateRowChanges):
# rows from before and after an ADD COLUMN pending together panic it ("index out of range [6]
# with length 6") and it stops validating. With the validator, no change of a column count.
CHANGES_COLUMNS = "ADD COLUMN"
PATHS: dict[str, dict[str, Any]] = {
    "online-ddl": {"task": {"online-ddl": True}, "statements": ONLINE_CHANGES},
    "validator": {
        "task": {"validators": {"global": {"mode": "full"}}},
        "instance": {"validator-config-name": "global"},
        "same_columns": True,
    },
    "relay": {"source": {"enable-relay": True}},
    "compact": {"syncer": {"compact": True, "multiple-rows": True}},
    "loader-replace": {},  # the lab's loaders.on-duplicate-logical: replace, with a bigger preload (--load-scale)
}


def path_unavailable_reason(path: str) -> str | None:
    if PATHS[path].get("statements") is ONLINE_CHANGES and shutil.which(PT_OSC) is None:
        return f"no {PT_OSC} on PATH (Debian: apt-get install percona-toolkit)"
    return None


def path_setup(base: Setup, *paths: str) -> Setup:
    """``base`` (one shard) in DM's modes ``paths`` at once: their settings, and with online
    DDL its pt-online-schema-change runs besides the plain DDL."""
    merged: dict[str, dict[str, Any]] = {key: {} for key in ("task", "instance", "source", "syncer")}
    statements = list(base.statements)
    for path in paths:
        for key, settings in merged.items():
            settings.update(PATHS[path].get(key, {}))
        statements += PATHS[path].get("statements", [])
    if any(PATHS[path].get("same_columns") for path in paths):
        statements = [(at, what) for at, what in statements if CHANGES_COLUMNS not in str(what)]
    return replace(base, label=f"{'+'.join(paths)} {base.faults} {base.target}", shards=1, shard_mode=None, statements=statements,
                   **merged)  # fmt: skip


def merged_corpus(folders: list[Path]) -> list[dict[str, Any]]:
    """DM's statements of the ``direct`` runs in ``folders`` (``dm_statements-<path>-<faults>-direct.jsonl``),
    one per shape: the first example, the count over every run, the paths it came in."""
    shapes: dict[str, dict[str, Any]] = {}
    for folder in folders:
        for file in sorted(Path(folder).glob("dm_statements-*-direct.jsonl")):
            path = next(p for p in sorted(PATHS, key=len, reverse=True) if file.name.startswith(f"dm_statements-{p}-"))
            for line in file.read_text().splitlines():
                entry = json.loads(line)
                shape, example = statement_shape(entry["sql"])
                merged = shapes.setdefault(shape, {"sql": example, "count": 0, "paths": []})
                merged["count"] += entry["count"]
                if path not in merged["paths"]:
                    merged["paths"].append(path)
    return list(shapes.values())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.dm_paths", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--paths", default=",".join(PATHS), help=f"some of {','.join(PATHS)} (default all)")
    p.add_argument("--targets", default="proxy", help="proxy (the sidecar), direct (DM to the first tidb-server) (default proxy)")
    p.add_argument("--faults", default="rolling", help="rolling (SIGTERM in turn), kill (SIGKILL in turn), none (default rolling)")
    lab_arguments(p, "dm_paths", duration=120, rate=100)
    p.add_argument("--load-scale", type=int, default=60000, help="orders preloaded for loader-replace (default 60000)")
    p.add_argument("--general-log", action="store_true", help="TiDB's general log on in direct runs: DM's statements, one per shape")
    p.add_argument("--corpus", type=Path, nargs="+", metavar="RESULTS_DIR",
                   help="no run: print the DM statements of these results' direct runs, merged (the corpus)")  # fmt: skip
    args = p.parse_args(argv)
    args.paths = [x for x in args.paths.split(",") if x]
    unknown = [x for x in args.paths if x not in PATHS]
    if unknown:
        p.error(f"unknown path(s) {', '.join(unknown)}: some of {', '.join(PATHS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.corpus:
        sys.stdout.writelines(json.dumps(entry) + "\n" for entry in merged_corpus(args.corpus))
        return 0
    for path in args.paths:
        reason = path_unavailable_reason(path)
        if reason is not None:
            print(f"bench.dm_paths: {path}: {reason}", file=sys.stderr)
            return 2
    setups = []
    for path in args.paths:
        for target in args.targets.split(","):
            base = Setup(faults=args.faults, target=target, duration=args.duration, interval=args.interval, servers=args.servers,
                         graceful_wait=args.graceful_wait, scale=args.load_scale if path == "loader-replace" else args.scale,
                         rate=args.rate, catch_up=args.catch_up, general_log=args.general_log and target == "direct")  # fmt: skip
            setups.append(path_setup(base, path))
    return main_loop("bench.dm_paths", setups, args.out, argv, vars(args))


if __name__ == "__main__":
    sys.exit(main())

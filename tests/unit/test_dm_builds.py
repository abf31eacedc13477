"""bench.dm_builds: which DM builds a bench.dm_e2e command compares (``--dm-bin``), what each
says it is, and the runs made of them with ``--targets`` and ``--safe-mode``; and the summary
table that names each run's DM."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench import dm_builds
from bench.dm_builds import DMBuild, RunSpec, parse_dm_bins, parse_safe_modes, parse_version, plan_runs
from bench.dm_e2e import parse_args, summary

V855 = DMBuild("v8.5.5", Path("/a"), "v8.5.5", "0cb0aaf2", False)
FIX = DMBuild("fix", Path("/b"), "v8.5.5", "0cb0aaf2", True)


def test_dm_bin_takes_labels_folders_and_comma_lists():
    assert parse_dm_bins(["v855=/x/bin,fix=/y/bin", "/z/bin"]) == [
        ("v855", Path("/x/bin")),
        ("fix", Path("/y/bin")),
        (None, Path("/z/bin")),
    ]
    assert parse_dm_bins([]) == []
    with pytest.raises(ValueError, match="empty label"):
        parse_dm_bins(["=/x/bin"])


def test_version_from_dm_worker_dash_v():
    text = "Release Version: v8.5.5\nGit Commit Hash: 0cb0aaf25061\nGit Branch: HEAD\nGo Version: go1.26.8\n"
    assert parse_version(text) == ("v8.5.5", "0cb0aaf25061")
    with pytest.raises(ValueError, match="Release Version"):
        parse_version("flag provided but not defined: -V")


def test_the_fix_is_told_by_its_error_code_in_the_program(tmp_path):
    program = tmp_path / "dm-worker"
    # the mark straddles the boundary between two pieces read
    program.write_bytes(b"x" * 10 + dm_builds.FIX_MARK + b"y" * 10)
    assert dm_builds.has_mark(program, chunk=14)
    program.write_bytes(b"x" * 40)
    assert not dm_builds.has_mark(program, chunk=14)


def test_probe_reads_the_build_and_labels_it_by_what_it_is(tmp_path):
    for name in ("dm-master", "dm-ctl"):
        (tmp_path / name).write_text("#!/bin/sh\n")
    worker = tmp_path / "dm-worker"
    worker.write_text("#!/bin/sh\necho 'Release Version: v8.5.5'\necho 'Git Commit Hash: abc'\nexit 0\n# DBExecuteFailedBegin\n")
    for name in ("dm-master", "dm-ctl", "dm-worker"):
        os.chmod(tmp_path / name, 0o755)
    assert dm_builds.probe(None, tmp_path) == DMBuild("v8.5.5+#12078", tmp_path.resolve(), "v8.5.5", "abc", True)
    assert dm_builds.probe("mine", tmp_path).label == "mine"
    os.remove(tmp_path / "dm-ctl")
    with pytest.raises(ValueError, match="no dm-ctl in"):
        dm_builds.probe("mine", tmp_path)


def test_runs_every_build_with_every_target_unless_the_target_names_one():
    runs = plan_runs([V855, FIX], ["direct", "fix:haproxy", "proxy"], [False, True])
    assert [(r.build.label, r.target, r.safe_mode) for r in runs[:5]] == [
        ("v8.5.5", "direct", False), ("fix", "direct", False), ("fix", "haproxy", False),
        ("v8.5.5", "proxy", False), ("fix", "proxy", False),
    ]  # fmt: skip
    assert [r.safe_mode for r in runs[5:]] == [True] * 5
    assert [r.name for r in runs[5:7]] == ["v8.5.5-direct-safe", "fix-direct-safe"]
    with pytest.raises(ValueError, match="no DM build labelled 'v9'"):
        plan_runs([V855], ["v9:direct"], [False])


def test_safe_mode_settings():
    assert parse_safe_modes("off") == [False]
    assert parse_safe_modes("off,on") == [False, True]
    assert parse_safe_modes("on, on") == [True]
    with pytest.raises(ValueError):
        parse_safe_modes("yes")


def test_command_line_checks_labelled_targets_and_safe_mode():
    args = parse_args(["--cluster", "--dm-bin", "fix=/b", "--targets", "direct,fix:tiproxy", "--safe-mode", "off,on"])
    assert args.targets == ["direct", "fix:tiproxy"] and args.safe_modes == [False, True] and args.dm_bin == ["fix=/b"]
    with pytest.raises(SystemExit):
        parse_args(["--targets", "fix:nowhere"])
    with pytest.raises(SystemExit):
        parse_args(["--targets", "fix:tiproxy"])  # TiProxy needs a cluster, whoever's DM
    with pytest.raises(SystemExit):
        parse_args(["--safe-mode", "maybe"])


def _run(spec: RunSpec, pauses: tuple[int, int], seen_1158: int, proxy: dict | None) -> dict:
    by_phase = {name: {"pauses": n, "failed_txns": 3 * n} for name, n in zip(("load", "sync"), pauses)}
    return {
        "target": spec.target, "dm_build": spec.build.to_json(), "safe_mode": spec.safe_mode, "downstream": "tidb-server",
        "started": 0.0, "ended": 100.0, "lag": [(10.0, 4.0), (50.0, 12.5), (150.0, 99.0)],
        "restarts": [{"stop": 20.0 * i, "signal": "SIGTERM", "graceful_wait": i % 2 * 3, "phase": "sync"} for i in range(1, 5)],
        "dm": {"by_phase": by_phase, "paused_s": 41.6, "never_resumed": 0, "seen_1158": seen_1158, "sync_started": 5.0},
        "proxy": proxy, "identical": True,
    }  # fmt: skip


def test_summary_names_each_runs_dm_and_what_it_went_through():
    runs = [
        _run(RunSpec(FIX, "direct", True), (0, 6), 0, None),
        _run(RunSpec(V855, "proxy", False), (0, 0), 0, {"recoveries": {"aborted_1158": 2.0}}),
    ]
    lines = summary({"runs": runs}).splitlines()
    assert lines[0].startswith("| DM | middle | safe mode |")
    assert [c.strip() for c in lines[2].strip("|").split("|")] == [
        "v8.5.5+#12078", "directly", "on", "0 / 4 SIGTERM wait 0,3 s", "0 / 6", "42", "0 / 18", "0", "-", "12.5", "yes",
    ]  # fmt: skip
    assert [c.strip() for c in lines[3].strip("|").split("|")][:2] == ["v8.5.5", "through proxy"]
    assert lines[3].split("|")[9].strip() == "2"  # the proxy's own 1158s

"""The DM builds bench.dm_e2e compares, and which runs it makes of them.

A build is a folder holding dm-master, dm-worker and dm-ctl, named by a label on the command
line (``--dm-bin LABEL=DIR``, or just ``DIR``: then the label is the build's own description).
What each one is comes from the build itself, never from its label: the version as
``dm-worker -V`` prints it, and whether its dm-worker carries tiflow PR #12078 (the seed's fix:
reset the connection and retry an ``invalid connection`` on BEGIN, or on any statement in safe
mode), seen by the name of the error code that PR adds (10007, ``DBExecuteFailedBegin``) in the
dm-worker program: v8.5.5 has no such code, a build with the PR applied has it (the PR's
release-8.5 cherry-pick does not change ``-V``'s output).

A run is one DM build with one middle and one safe-mode setting (``plan_runs``): every build
with every target of ``--targets``, except where a target names its build (``LABEL:target``),
each of them with every ``--safe-mode`` setting.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tests.lab.dm import dm_missing_in, dm_program

FIX_MARK = b"DBExecuteFailedBegin"  # tiflow PR #12078's new error code, in terror's table of code names
FIX_NAME = "#12078"


@dataclass(frozen=True)
class DMBuild:
    label: str
    folder: Path | None  # None: where the lab finds DM by default (tests/lab/dm.py)
    version: str  # "Release Version" of dm-worker -V
    commit: str  # "Git Commit Hash" of dm-worker -V (a patched build shows its base's)
    fix: bool  # dm-worker carries tiflow PR #12078

    @property
    def description(self) -> str:
        return f"{self.version}+{FIX_NAME}" if self.fix else self.version

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"folder": None if self.folder is None else str(self.folder), "description": self.description}


@dataclass(frozen=True)
class RunSpec:
    build: DMBuild
    target: str
    safe_mode: bool  # syncers.safe-mode: true (else DM's default: safe mode only after a start or resume)

    @property
    def name(self) -> str:
        """The run's folder in the results: label, target, safe mode."""
        safe = "-safe" if self.safe_mode else ""
        return re.sub(r"[^A-Za-z0-9_.+-]", "_", f"{self.build.label}-{self.target}{safe}")


def parse_dm_bins(values: list[str]) -> list[tuple[str | None, Path]]:
    """``--dm-bin`` values (repeated, each a comma list of ``LABEL=DIR`` or ``DIR``): (label or
    None, folder) in the order given."""
    out: list[tuple[str | None, Path]] = []
    for value in values:
        for item in (part.strip() for part in value.split(",")):
            if not item:
                continue
            label, sep, folder = item.partition("=")
            out.append((label.strip(), Path(folder.strip())) if sep else (None, Path(item)))
    if any(label == "" for label, _ in out):
        raise ValueError("--dm-bin: an empty label before '=' (LABEL=DIR)")
    return out


def parse_version(text: str) -> tuple[str, str]:
    """(release version, commit) from ``dm-worker -V``'s output."""
    version = re.search(r"^Release Version:\s*(\S+)", text, re.M)
    commit = re.search(r"^Git Commit Hash:\s*(\S+)", text, re.M)
    if version is None:
        raise ValueError(f"no 'Release Version:' in dm-worker -V's output: {text[:300]!r}")
    return version.group(1), commit.group(1) if commit else "?"


def has_mark(path: Path, mark: bytes = FIX_MARK, chunk: int = 1 << 22) -> bool:
    """Whether the file holds ``mark`` (read in pieces: dm-worker is ~200 MB)."""
    tail = b""
    with open(path, "rb") as f:
        while block := f.read(chunk):
            window = tail + block
            if mark in window:
                return True
            tail = window[1 - len(mark) :]
    return False


def probe(label: str | None, folder: Path | None) -> DMBuild:
    """The build in ``folder`` (None: the lab's default DM), as it says of itself."""
    if folder is not None:
        reason = dm_missing_in(folder)
        if reason is not None:
            raise ValueError(f"--dm-bin {folder}: {reason}")
    worker = str(folder / "dm-worker") if folder is not None else dm_program("dm-worker")
    if worker is None:
        raise ValueError("no dm-worker found (tests/lab/dm.py says where it is looked for)")
    answer = subprocess.run([worker, "-V"], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    version, commit = parse_version(answer.stdout + answer.stderr)
    fix = has_mark(Path(worker))
    build = DMBuild(label or "", None if folder is None else folder.resolve(), version, commit, fix)
    return build if label else DMBuild(build.description, build.folder, version, commit, fix)


def probe_all(values: list[str]) -> list[DMBuild]:
    """The builds of ``--dm-bin`` (none given: the lab's default DM), labels unique."""
    builds = [probe(label, folder) for label, folder in parse_dm_bins(values)] or [probe(None, None)]
    labels = [b.label for b in builds]
    twice = sorted({label for label in labels if labels.count(label) > 1})
    if twice:
        raise ValueError(f"--dm-bin: label(s) {', '.join(twice)} given to more than one build: name them (LABEL=DIR)")
    return builds


def plan_runs(builds: list[DMBuild], targets: list[str], safe_modes: list[bool]) -> list[RunSpec]:
    """Every (safe mode, target, build), in that order of nesting: a target ``LABEL:target``
    runs with that build only, a plain one with each build in turn."""
    by_label = {b.label: b for b in builds}
    runs = []
    for safe in safe_modes:
        for entry in targets:
            label, sep, target = entry.rpartition(":")
            if sep and label not in by_label:
                raise ValueError(f"--targets {entry}: no DM build labelled {label!r} (--dm-bin: {', '.join(by_label)})")
            runs += [RunSpec(b, target, safe) for b in ([by_label[label]] if sep else builds)]
    return runs


def parse_safe_modes(value: str) -> list[bool]:
    """``--safe-mode``: off, on, or both as a comma list (each setting its own runs)."""
    words = [w.strip().lower() for w in value.split(",") if w.strip()]
    bad = [w for w in words if w not in ("on", "off")]
    if bad or not words:
        raise ValueError(f"--safe-mode takes on, off or on,off (got {value!r})")
    return [w == "on" for w in dict.fromkeys(words)]

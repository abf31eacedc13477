"""The deployment examples stay in step with the config they carry."""

from __future__ import annotations

import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def configmap_file(manifest: str, key: str) -> str:
    """The text of a ``key: |`` block scalar (what the ConfigMap mounts as a file)."""
    lines = manifest.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.strip() == f"{key}: |")
    indent = len(lines[start]) - len(lines[start].lstrip()) + 2
    block = []
    for line in lines[start + 1 :]:
        if line.strip() and len(line) - len(line.lstrip()) < indent:
            break
        block.append(line)
    return textwrap.dedent("".join(block)).rstrip("\n") + "\n"


def test_the_kubernetes_configmap_carries_configs_dm_sidecar_unchanged():
    manifest = (REPO / "configs/deploy/kubernetes/dm-worker-with-proxy.yaml").read_text()
    assert configmap_file(manifest, "proxy.toml") == (REPO / "configs/dm-sidecar.toml").read_text()

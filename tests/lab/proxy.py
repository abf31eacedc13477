"""Run the real proxy (``python -m proxy --config ...``) as a subprocess for integration tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.lab.mariadb import free_port
from tests.lab.procs import kill_at_exit, read_log, terminate, wait_listening

REPO = Path(__file__).resolve().parents[2]


def toml_value(value: Any) -> str:
    """A TOML value; dicts become inline tables."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} as TOML")


def toml_key(key: str) -> str:
    """A bare key where TOML allows one, else a quoted one."""
    return key if key.replace("_", "").replace("-", "").isalnum() else toml_value(key)


def write_config(path: Path, sections: dict[str, Any]) -> Path:
    """Write a config from {"listen": {...}, "users": [{...}], "plugins": {"chain": [...], "x": {...}}}."""
    lines: list[str] = []
    for key, value in sections.items():
        if not isinstance(value, (dict, list)) or (isinstance(value, list) and value and not isinstance(value[0], dict)):
            lines.insert(0, f"{key} = {toml_value(value)}")
    for key, value in sections.items():
        if isinstance(value, dict):
            lines.append(f"[{key}]")
            nested = {k: v for k, v in value.items() if isinstance(v, dict)}
            for k, v in value.items():
                if not isinstance(v, dict):
                    lines.append(f"{k} = {toml_value(v)}")
            for k, v in nested.items():
                lines.append(f"[{key}.{k}]")
                lines.extend(f"{toml_key(kk)} = {toml_value(vv)}" for kk, vv in v.items())
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            for item in value:
                lines.append(f"[[{key}]]")
                lines.extend(f"{k} = {toml_value(v)}" for k, v in item.items())
    path.write_text("\n".join(lines) + "\n")
    return path


class ProxyProcess:
    """A proxy subprocess in front of ``backend_port``; stop() checks it exited cleanly."""

    def __init__(self, workdir: Path, backend_port: int | list[int], **overrides: Any) -> None:
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.admin_port = free_port()
        ports = backend_port if isinstance(backend_port, list) else [backend_port]
        sections: dict[str, Any] = {
            "name": "test",
            "listen": {"address": f"127.0.0.1:{self.port}"},
            "backend": {"addresses": [f"127.0.0.1:{p}" for p in ports]},
            "users": [{"name": "app", "password": "apppw"}, {"name": "root", "password": ""}],
            "admin": {"address": f"127.0.0.1:{self.admin_port}"},
            "log": {"level": "debug"},
        }
        for key, value in overrides.items():
            if isinstance(value, dict) and isinstance(sections.get(key), dict):
                sections[key] = {**sections[key], **value}
            else:
                sections[key] = value
        self.config_path = write_config(self.workdir / "proxy.toml", sections)
        self._own_admin = sections.get("admin", {}).get("address") == f"127.0.0.1:{self.admin_port}"
        self.log_path = self.workdir / "proxy.log"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 20) -> ProxyProcess:
        self._log = open(self.log_path, "ab")
        env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "proxy", "--config", str(self.config_path)],
            cwd=REPO,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        kill_at_exit(self.proc)
        wait_listening(self.proc, self.port, timeout, "proxy", self.log_text)
        if self._own_admin:  # the admin endpoint starts beside the listener, not before it
            wait_listening(self.proc, self.admin_port, timeout, "proxy admin", self.log_text)
        return self

    def log_text(self) -> str:
        return read_log(self.log_path)

    def stop(self, timeout: float = 10, tracebacks: int = 0) -> str:
        """SIGTERM, wait, and return the log. Raises if the proxy crashed or logged a traceback
        (more than ``tracebacks``: a test that injects a bug expects its own)."""
        if self.proc is None:
            return self.log_text()
        if not terminate(self.proc, timeout):
            raise RuntimeError(f"proxy ignored SIGTERM for {timeout}s:\n{self.log_text()[-3000:]}")
        self._log.close()
        text = self.log_text()
        if text.count("Traceback") > tracebacks:
            raise AssertionError(f"proxy logged a traceback:\n{text[-5000:]}")
        return text

    def __enter__(self) -> ProxyProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

"""dnnperf's cache directory: datasets written once, and results that are costly to recompute."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from dnnperf.jsonio import write_json_atomic

CACHE_DIR_ENV = "DNNPERF_CACHE_DIR"


def cache_dir() -> Path:
    """``$DNNPERF_CACHE_DIR``, else ``$XDG_CACHE_HOME/dnnperf`` (``~/.cache/dnnperf``)."""
    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dnnperf"


class JsonCache:
    """A small key -> JSON value store in one file. Unreadable or unwritable caches are ignored:
    the cache only saves time, it never decides a result."""

    def __init__(self, name: str) -> None:
        self.path = cache_dir() / f"{name}.json"

    def _load(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def get(self, key: str) -> Any:
        return self._load().get(key)

    def entries(self) -> dict[str, Any]:
        """Every key and value, read once (for a caller that looks up many)."""
        return self._load()

    def put(self, key: str, value: Any) -> None:
        self.put_many({key: value})

    def put_many(self, values: dict[str, Any]) -> None:
        """Several keys in one write."""

        data = self._load()
        data.update(values)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.path, data)
        except OSError:
            pass

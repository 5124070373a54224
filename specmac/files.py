"""Files written whole: a reader sees the old file or the whole new one, never a part. Imports the
standard library alone, so every layer can use it (result records, the kept pass costs)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def write_json(path: str | Path, record: Any) -> Path:
    """Write record as JSON atomically: a temporary file in the same folder, then a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(record, f, indent=2, default=str)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def cache_home() -> Path:
    """Where specmac keeps what outlives a run (converted models, measured pass costs):
    $SPECMAC_CACHE, else ~/.cache/specmac."""
    return Path(os.environ.get("SPECMAC_CACHE") or Path.home() / ".cache" / "specmac").expanduser()

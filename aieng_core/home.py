"""Where state lives: $AIENG_HOME (default ./.aieng) and the paths inside it."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

DEFAULT_HOME = ".aieng"


def resolve_home(home: str | os.PathLike | None = None) -> Path:
    """The argument, else $AIENG_HOME, else ./.aieng, as an absolute path."""
    chosen = home or os.environ.get("AIENG_HOME") or DEFAULT_HOME
    return Path(chosen).expanduser().resolve()


def raw_partition_dir(home: Path, partition: str) -> Path:
    """Landing folder of one daily partition: $AIENG_HOME/raw/YYYY-MM-DD/."""
    return home / "raw" / parse_partition(partition).isoformat()


def parse_partition(partition: str) -> dt.date:
    """A daily partition key, YYYY-MM-DD; anything else is a clear error."""
    try:
        day = dt.date.fromisoformat(partition)
    except (TypeError, ValueError):
        raise ValueError(f"partition {partition!r} is not a date in YYYY-MM-DD form") from None
    if day.isoformat() != partition:
        raise ValueError(f"partition {partition!r} is not a date in YYYY-MM-DD form")
    return day

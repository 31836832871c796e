"""The last rollback readiness check of a pointer, on disk: one JSON file, replaced atomically.

`$AIENG_HOME/deployments/<pointer>/rollback-check.json` holds the result of the last check of
the bundle a rollback of that pointer would make current (deploy/rollback_readiness.py runs
it: re-hash, load, replay the goldens). Every view reads this one file: `aieng deploy
status`, the Dagster asset check, and the server's `aieng_rollback_target_ready` gauge.

`{pointer, checked_at, sequence, bundle_id, ok, problems, goldens_checked, seconds}`:
`sequence` is the pointer's sequence when it was checked (a later change of the pointer makes
the result stale: it checked another stack), `bundle_id` the rollback target (None: nothing to
roll back to, and `ok` is None), `ok` whether it verified, loaded and replayed its goldens.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from aieng_core.hashing import canonical_json
from aieng_core.store.atomic import atomic_write_bytes
from aieng_core.store.pointers import PRODUCTION, Pointer

CHECK_FILE = "rollback-check.json"
KEYS = ("pointer", "checked_at", "sequence", "bundle_id", "ok", "problems", "goldens_checked", "seconds")


class RollbackCheckError(ValueError):
    """rollback-check.json is unreadable or not a check result (named in the message)."""


def check_path(home: Path | str, pointer: str = PRODUCTION) -> Path:
    return Pointer(home, pointer).directory / CHECK_FILE


def write_check(home: Path | str, result: dict[str, Any]) -> Path:
    """Write `result` as the pointer's last check, unless a check of a later sequence is
    already there (two checks ran at once and the older one finished last)."""
    missing = [key for key in KEYS if key not in result]
    if missing:
        raise ValueError(f"a rollback check result needs {', '.join(missing)}")
    path = check_path(home, result["pointer"])
    try:
        newer = read_check(home, result["pointer"])
    except RollbackCheckError:
        newer = None  # a damaged file is replaced by a result
    if newer is not None and newer["sequence"] > result["sequence"]:
        return path  # a check of a later state of the pointer finished first: it stands
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, canonical_json(result))
    return path


def read_check(home: Path | str, pointer: str = PRODUCTION) -> dict[str, Any] | None:
    """The last check of `pointer`, or None when none ran. RollbackCheckError when the file is
    damaged (a damaged result is not a passed check)."""
    path = check_path(home, pointer)
    try:
        doc = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise RollbackCheckError(f"{path}: unreadable: {exc.strerror}") from None
    except ValueError as exc:
        raise RollbackCheckError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(doc, dict) or any(key not in doc for key in KEYS):
        raise RollbackCheckError(f"{path}: not a rollback check result (needs {', '.join(KEYS)})")
    return doc


def is_stale(check: dict[str, Any], current_sequence: int) -> bool:
    """Whether the pointer changed since `check` ran (it checked another rollback target)."""
    return check["sequence"] != current_sequence

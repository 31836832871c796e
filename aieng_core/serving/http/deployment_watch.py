"""What a server that follows a deployment pointer says about that deployment besides what it
serves: whether the rollback target of its pointer is ready (the last readiness check), read
on every poll of the pointer (following.py) and exported as metrics (metrics.py).

The check is one small file, `$AIENG_HOME/deployments/<pointer>/rollback-check.json`
(store/rollback_check.py), written by `aieng deploy check-rollback` and the scheduled check.
Read as the server exports it:

- ready: the check verified, loaded and replayed the target's goldens (`ok`) and the pointer
  has not changed since (its sequence is the check's); a failed check and a damaged file
  count as not ready.
- stale (the pointer moved since: another stack, perhaps another target), no check yet, or a
  check that found nothing to roll back to: no readiness at all (no
  `aieng_rollback_target_ready` series: a label naming an old target would say something
  about a bundle that may no longer be the target); `aieng_rollback_check_stale` is 1 for a
  stale check and for none at all, and with the check's age
  (`aieng_rollback_check_age_seconds`) it says how old the last word is. `aieng deploy
  status` reads the same file the same way.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

from aieng_core.store.request_log import UNKNOWN_DATA_VERSION
from aieng_core.store.rollback_check import RollbackCheckError, is_stale, read_check

UNKNOWN_BUNDLE = UNKNOWN_DATA_VERSION  # "unknown": the target a damaged check file names


@dataclass(frozen=True)
class RollbackReadiness:
    """The last rollback readiness check of a pointer, as the server exports it."""

    pointer: str
    bundle_id: str | None  # the target checked; None: nothing to roll back to; "unknown": damaged file
    ready: bool | None  # None: nothing to roll back to (no readiness to report)
    stale: bool  # the pointer changed since the check ran
    checked_at: float | None  # seconds since the epoch; None when the file is damaged
    problem: str | None  # why not ready, in one line

    def age_seconds(self, now: float) -> float | None:
        return None if self.checked_at is None else max(0.0, now - self.checked_at)


def _timestamp(value: object) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        moment = dt.datetime.fromisoformat(value)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return moment.timestamp()


def read_rollback_readiness(home: Path | str, pointer: str, sequence: int) -> RollbackReadiness:
    """The last check of `pointer`, judged against the pointer's `sequence` now. Never raises
    for the file: a damaged one is a check that did not pass."""
    try:
        check = read_check(home, pointer)
    except RollbackCheckError as exc:
        return RollbackReadiness(pointer, UNKNOWN_BUNDLE, False, False, None, str(exc))
    if check is None:  # never checked: as stale as a check can be
        return RollbackReadiness(pointer, None, None, True, None, "no rollback readiness check has run yet")
    stale = is_stale(check, sequence)
    checked_at = _timestamp(check["checked_at"])
    target = check["bundle_id"]
    if target is None:
        return RollbackReadiness(pointer, None, None, stale, checked_at, None)
    problems = check["problems"] if isinstance(check["problems"], list) else []
    problem: str | None
    if stale:
        problem = f"the last check (at sequence {check['sequence']}) predates the pointer's sequence {sequence}"
        return RollbackReadiness(pointer, str(target), None, True, checked_at, problem)
    if check["ok"] is not True:
        problem = str(problems[0]) if problems else "the check did not pass"
    else:
        problem = None
    return RollbackReadiness(pointer, str(target), problem is None, False, checked_at, problem)

"""The rollback readiness a following server exports (serving/http/deployment_watch.py), read
from a real rollback-check.json: passed and current is ready; failed or damaged is not; stale,
no check, or nothing to roll back to, is no readiness at all (stale and no check say stale)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from aieng_core.serving.http.deployment_watch import RollbackReadiness, read_rollback_readiness
from aieng_core.store.rollback_check import check_path, write_check

CHECKED_AT = "2026-02-01T10:00:00.000+00:00"
CHECKED_TS = dt.datetime(2026, 2, 1, 10, tzinfo=dt.UTC).timestamp()


def check(**changes: Any) -> dict[str, Any]:
    result = {
        "pointer": "production",
        "checked_at": CHECKED_AT,
        "sequence": 4,
        "bundle_id": "b1",
        "ok": True,
        "problems": [],
        "goldens_checked": 3,
        "seconds": 1.5,
    }
    return {**result, **changes}


def test_no_check_yet_is_no_readiness_and_stale(tmp_path: Path) -> None:
    assert read_rollback_readiness(tmp_path, "production", 4) == RollbackReadiness(
        "production", None, None, True, None, "no rollback readiness check has run yet"
    )


@pytest.mark.parametrize(
    ("written", "sequence", "expected"),
    [
        (check(), 4, RollbackReadiness("production", "b1", True, False, CHECKED_TS, None)),
        (
            check(ok=False, problems=["serving_bundle/b1/model.safetensors: sha256 does not match the manifest"]),
            4,
            RollbackReadiness(
                "production",
                "b1",
                False,
                False,
                CHECKED_TS,
                "serving_bundle/b1/model.safetensors: sha256 does not match the manifest",
            ),
        ),
        (
            check(),
            5,
            RollbackReadiness(
                "production",
                "b1",
                None,
                True,
                CHECKED_TS,
                "the last check (at sequence 4) predates the pointer's sequence 5",
            ),
        ),
        (
            check(bundle_id=None, ok=None, goldens_checked=0),
            4,
            RollbackReadiness("production", None, None, False, CHECKED_TS, None),
        ),
    ],
    ids=["passed", "failed", "stale", "nothing-to-roll-back-to"],
)
def test_a_check_is_read_against_the_pointer_now(
    tmp_path: Path, written: dict[str, Any], sequence: int, expected: RollbackReadiness
) -> None:
    write_check(tmp_path, written)
    readiness = read_rollback_readiness(tmp_path, "production", sequence)
    assert readiness == expected
    assert readiness is not None and readiness.age_seconds(CHECKED_TS + 90) == 90.0


def test_a_damaged_check_file_is_not_ready_naming_it(tmp_path: Path) -> None:
    path = check_path(tmp_path, "production")
    path.parent.mkdir(parents=True)
    path.write_text('{"pointer": "production", "ok": tr', encoding="utf-8")
    readiness = read_rollback_readiness(tmp_path, "production", 4)
    assert readiness is not None
    assert (readiness.bundle_id, readiness.ready, readiness.stale, readiness.checked_at) == (
        "unknown",
        False,
        False,
        None,
    )
    assert readiness.problem is not None and readiness.problem.startswith(f"{path}: not valid JSON")
    assert readiness.age_seconds(CHECKED_TS) is None

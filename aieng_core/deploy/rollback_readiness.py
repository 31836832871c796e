"""Is the rollback target ready? Checked, not assumed.

A rollback makes the top of a pointer's stack current again (withdrawn bundles passed over:
deploy/withdrawn.py). Two answers about that bundle:

- `target_integrity`: a re-hash of its files against its manifest (cheap: nothing is
  loaded), what `aieng deploy status` shows for the previous bundle.
- `check_rollback_target`: the readiness check proper, run by `aieng deploy check-rollback`
  and on a schedule: the target is re-hashed, its model loaded and its goldens replayed
  through the serving engine (aieng_core.bundle.verify.verify_bundle, what a promote runs),
  timed, and the result written to the pointer's rollback-check.json
  (store/rollback_check.py), which every view reads.
"""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import Any

from aieng_core.asset_keys import SERVING_BUNDLE as KIND
from aieng_core.deploy.withdrawn import rollback_target, withdrawn_from
from aieng_core.store import ArtifactStore
from aieng_core.store.artifacts import MANIFEST
from aieng_core.store.pointers import PRODUCTION, Pointer
from aieng_core.store.rollback_check import RollbackCheckError, is_stale, read_check, write_check

__all__ = ["check_rollback_target", "last_check", "missing_problem", "pointer_rollback_target", "target_integrity"]

INTEGRITY_OK = "ok"
INTEGRITY_MISSING = "missing"


def missing_problem(store: ArtifactStore, bundle_id: str) -> str:
    return f"{store.artifact_dir(KIND, bundle_id) / MANIFEST}: missing ({KIND} {bundle_id} is not in the store)"


def pointer_rollback_target(pointer: Pointer) -> tuple[dict[str, Any], str | None]:
    """(current.json, the bundle a rollback would make current now or None), from the
    pointer's applied history as the deploy policy reads it."""
    current, applied = pointer.applied()
    return current, rollback_target(current["stack"], withdrawn_from(applied), current["bundle_id"])


def target_integrity(store: ArtifactStore, bundle_id: str) -> str:
    """ "ok", "missing" (not in the store), or the first problem of a re-hash of the bundle's
    files, naming the file (the model is not loaded)."""
    from aieng_core.bundle.verify import BundleVerificationError, file_problems, read_manifest

    path = store.artifact_dir(KIND, bundle_id)
    if not path.is_dir():
        return INTEGRITY_MISSING
    try:
        manifest = read_manifest(path)
    except BundleVerificationError as exc:
        return str(exc)
    if manifest.get("id") != bundle_id:
        return f"{path / MANIFEST}: names id {manifest.get('id')!r}, not {bundle_id!r}"
    problems = file_problems(path, manifest)
    if not problems:
        return INTEGRITY_OK
    return problems[0] + (f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else "")


def last_check(home: Path | str, pointer: str, sequence: int) -> dict[str, Any] | None:
    """The last readiness check of `pointer` with `stale` (the pointer moved since: it
    checked another stack), or None when none ran. A damaged result file reads as a failed
    check naming the file (a damaged result is not a passed check)."""
    try:
        check = read_check(home, pointer)
    except RollbackCheckError as exc:
        return {
            "pointer": pointer,
            "checked_at": None,
            "sequence": None,
            "bundle_id": None,
            "ok": False,
            "problems": [str(exc)],
            "goldens_checked": 0,
            "seconds": None,
            "stale": True,
        }
    if check is None:
        return None
    return {**check, "stale": is_stale(check, sequence)}


def check_rollback_target(home: Path | str, pointer: str = PRODUCTION) -> dict[str, Any]:
    """Verify what a rollback of `pointer` would make current (re-hash, load, replay the
    goldens), time it, record it in rollback-check.json and return it:
    `{pointer, checked_at, sequence, bundle_id, ok, problems, goldens_checked, seconds}`.
    Nothing to roll back to: bundle_id None, ok None. DeploymentError when the pointer's
    files are damaged (named)."""
    from aieng_core.bundle.verify import verify_bundle

    home = Path(home)
    files = Pointer(home, pointer)
    store = ArtifactStore(home)
    checked_at = dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")
    started = time.perf_counter()
    current, target = pointer_rollback_target(files)
    problems: list[str] = []
    goldens = 0
    ok: bool | None = None
    if target is not None:
        path = store.artifact_dir(KIND, target)
        if not (path / MANIFEST).is_file():
            problems = [missing_problem(store, target)]
        else:
            report = verify_bundle(path)
            problems = list(report["problems"])
            goldens = len(report["goldens"])
            if report["bundle_id"] != target and not problems:
                problems.append(f"{path / MANIFEST}: names id {report['bundle_id']!r}, not {target!r}")
        ok = not problems
    result = {
        "pointer": files.name,
        "checked_at": checked_at,
        "sequence": current["sequence"],
        "bundle_id": target,
        "ok": ok,
        "problems": problems,
        "goldens_checked": goldens,
        "seconds": round(time.perf_counter() - started, 3),
    }
    write_check(home, result)
    return result

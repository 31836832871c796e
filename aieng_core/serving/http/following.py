"""`aieng serve --deployment current`: serve whatever a deployment pointer names, and swap
when a promote or rollback changes it.

The pointer's current.json is replaced atomically by every change (store/pointers.py), so
reading it needs no lock: a poll sees the old pointer or the new one, never a mix. The
bundle's directory comes from the artifact store by id, not from the path written in the
pointer, so a home that moved (or is mounted elsewhere on a replica) still resolves; a
bundle the store does not hold is refused as any bundle that fails to load.

Each poll also reads the pointer's last rollback readiness check (deployment_watch.py): one
small file, exported as aieng_rollback_target_ready.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from aieng_core.asset_keys import SERVING_BUNDLE
from aieng_core.serving.http.deployment_watch import RollbackReadiness, read_rollback_readiness
from aieng_core.serving.http.state import BUNDLE_ERRORS, ServingState
from aieng_core.store import ArtifactStore
from aieng_core.store.canary_state import live_canary
from aieng_core.store.pointers import PRODUCTION, DeploymentError, Pointer

log = logging.getLogger("aieng.serving.http")

# How often the pointer is read: a promote or rollback is seen within this, then takes the
# time to load, verify and warm the bundle.
FOLLOW_INTERVAL_S = 0.2
# A bundle the pointer names but that was refused is tried again this often (a failure can
# pass: memory freed, a file restored), and at once when the pointer changes.
RETRY_REFUSED_S = 30.0


@dataclass(frozen=True)
class PointerTarget:
    pointer: str
    bundle_id: str | None  # None: nothing is deployed (never promoted, or rolled back to no bundle)
    path: Path | None
    sequence: int
    rollback: RollbackReadiness | None = None  # the pointer's last rollback readiness check
    canary: CanaryTarget | None = None  # a canary rollout's candidate beside the pointer, if one runs


@dataclass(frozen=True)
class CanaryTarget:
    bundle_id: str
    path: Path
    share: float  # of the generation requests, by request id (store/canary_state.py)


def read_target(home: Path, pointer: str = PRODUCTION) -> PointerTarget:
    """The bundle the pointer names now (its directory in the store, which loading it finds
    missing when the store does not hold it), with the pointer's last rollback check. Raises
    (naming the file) when the pointer is unreadable."""
    current = Pointer(home, pointer).current()
    bundle_id = current["bundle_id"]
    sequence = current["sequence"]
    rollback = read_rollback_readiness(home, pointer, sequence)
    if bundle_id is None:
        return PointerTarget(pointer, None, None, sequence, rollback)
    store = ArtifactStore(home)
    path = store.artifact_dir(SERVING_BUNDLE, bundle_id)
    canary = None
    try:
        running = live_canary(home, pointer, sequence, time.time())
    except DeploymentError as exc:  # a damaged canary file: no canary (production goes on)
        log.error("ignoring the canary rollout of the %s pointer: %s", pointer, exc)
        running = None
    if running is not None:
        canary_id = running["bundle_id"]
        canary = CanaryTarget(canary_id, store.artifact_dir(SERVING_BUNDLE, canary_id), float(running["share"]))
    return PointerTarget(pointer, bundle_id, path, sequence, rollback, canary)


async def follow_pointer(
    state: ServingState, interval_s: float = FOLLOW_INTERVAL_S, retry_s: float = RETRY_REFUSED_S
) -> None:
    """Poll the deployment pointer; swap (or empty) the served bundle when it changes.

    A bundle the pointer names but that fails to load or verify is refused (logged as an
    error) and the current one keeps serving; it is tried again every `retry_s`, and at once
    when the pointer changes. /health/ready and /version show what the pointer names beside
    what is served."""
    follow, reload_lock = state.follow, state.reload_lock
    assert follow is not None and reload_lock is not None
    unreadable: str | None = None
    while not state.draining:
        await asyncio.sleep(interval_s)
        if state.phase != "ready" or state.draining:
            continue
        try:
            target = await asyncio.to_thread(follow)
        except Exception as exc:
            if str(exc) != unreadable:  # once per distinct problem, not every poll
                unreadable = str(exc)
                log.error("cannot read the deployment pointer; still serving what was loaded: %s", exc)
            continue
        unreadable = None
        state.rollback = target.rollback
        unchanged = state.following is not None and target.bundle_id == state.following.bundle_id
        if not unchanged or (state.refused_at is not None and time.monotonic() - state.refused_at >= retry_s):
            async with reload_lock:
                await _switch(state, target, retry_s)
        await _follow_canary(state, target.canary, retry_s)


async def _follow_canary(state: ServingState, canary: CanaryTarget | None, retry_s: float) -> None:
    """Load the canary's candidate beside what is served (in a task of its own: the pointer is
    still followed meanwhile), route its share to it, and drop it when the rollout ends
    (rolled back, aborted, its process gone: no live canary.json; promoted: production
    adopted it) or its engine died."""
    state.canary_target = canary
    served = state.current.bundle_id if state.current is not None else None
    if state.canary is not None and not state.canary.loop.running:
        dead = state.uninstall_canary()
        bundle_id = dead.bundle_id if dead is not None else "?"
        state.canary_refused = (bundle_id, time.monotonic(), "its engine loop stopped after an error")
        log.error("canary %s: its engine loop stopped; every request goes to %s", bundle_id, served)
        return
    if canary is None or canary.bundle_id == served:
        if state.canary is not None:
            replica = state.uninstall_canary()
            log.info("canary %s ended: every request goes to %s", replica.bundle_id if replica else None, served)
        state.canary_refused = None
        return
    if state.canary is not None and state.canary.bundle_id == canary.bundle_id:
        if state.canary_share != canary.share:
            log.info("canary %s: now %.0f%% of the requests", canary.bundle_id, 100 * canary.share)
        state.canary_share = canary.share
        return
    refused = state.canary_refused
    if refused is not None and refused[0] == canary.bundle_id and time.monotonic() - refused[1] < retry_s:
        return
    if state.canary_loading is None:
        state.canary_loading = asyncio.get_running_loop().create_task(_load_canary(state, canary, retry_s))


async def _load_canary(state: ServingState, canary: CanaryTarget, retry_s: float) -> None:
    try:
        replica = await state.open_replica(canary.path)
    except Exception as exc:
        state.canary_refused = (canary.bundle_id, time.monotonic(), str(exc))
        log.error(
            "the canary's bundle %s was refused (retried in %g s); every request goes to the production bundle: %s",
            canary.bundle_id, retry_s, exc, exc_info=not isinstance(exc, BUNDLE_ERRORS),
        )  # fmt: skip
        return
    finally:
        state.canary_loading = None
    wanted = state.canary_target  # what the pointer's canary is now, after the load
    if wanted is None or wanted.bundle_id != replica.bundle_id or state.draining:
        await asyncio.to_thread(replica.stop, 10.0)  # the rollout ended while it loaded
        log.info("canary %s loaded after its rollout ended: stopped", replica.bundle_id)
        return
    state.install_canary(replica, wanted.share)
    served = state.current.bundle_id if state.current is not None else None
    log.info(
        "canary %s loaded beside %s: %.0f%% of the requests", replica.bundle_id, served, 100 * wanted.share,
        extra={"bundle_id": replica.bundle_id},
    )  # fmt: skip


async def _switch(state: ServingState, target: PointerTarget, retry_s: float) -> None:
    old_id = state.current.bundle_id if state.current is not None else None
    # A retry of the bundle refused keeps it refused (and the mismatch exported) until it
    # loads: a gauge that dropped to 0 for each retry would reset the alert's `for:`.
    before = state.following
    retrying = state.refused_at is not None and before is not None and before.bundle_id == target.bundle_id
    state.following = target
    if not retrying:
        state.refused_at, state.refusal = None, None
    if target.bundle_id is not None and target.bundle_id == old_id:
        state.refused_at, state.refusal = None, None
        return  # rolled back to the bundle still served (after a refused one): nothing to load
    if state.canary is not None and target.bundle_id == state.canary.bundle_id and state.canary.loop.running:
        state.refused_at, state.refusal = None, None
        state.adopt_canary()  # the canary was promoted: its replica, loaded and warm, serves everything
        log.info("following the %s pointer: the canary %s now serves every request (was %s)",
                 target.pointer, target.bundle_id, old_id)  # fmt: skip
        return
    if target.path is None:
        state.refused_at, state.refusal = None, None
        state.uninstall()
        log.warning("the %s pointer was emptied (was %s): %s", target.pointer, old_id, state.no_bundle_message())
        return
    started = time.monotonic()
    try:
        replica, _previous = await state.reload(target.path)
    except Exception as exc:
        state.refused_at, state.refusal = time.monotonic(), str(exc)
        log.error(
            "the %s pointer names bundle %s, which was refused (retried in %g s); still serving %s: %s",
            target.pointer,
            target.bundle_id,
            retry_s,
            old_id,
            exc,
            exc_info=not isinstance(exc, BUNDLE_ERRORS),
        )
        return
    state.refused_at, state.refusal = None, None
    log.info(
        "following the %s pointer: now serving %s (was %s)",
        target.pointer,
        replica.bundle_id,
        old_id,
        extra={
            "bundle_id": replica.bundle_id,
            "bundle_path": str(target.path),
            "latency_ms": round((time.monotonic() - started) * 1000, 1),
        },
    )

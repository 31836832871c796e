"""Deployment policy: which changes of a pointer are allowed, and how they are made.

A pointer's files (current.json, history.jsonl, the lock: store/pointers.py says the format)
only change through `Deployments`: a promote names a serving bundle that exists in the store,
carries its own id and (unless told otherwise) verifies, never the one already current, never
one a rollback withdrew unless asked explicitly (deploy/withdrawn.py); a rollback pops the
stack back to a bundle that exists and (unless told otherwise) verifies, passing over withdrawn
ones, and withdraws the bundle it left. Every refusal raises DeploymentError and changes nothing.
"""

from __future__ import annotations

import getpass
import logging
import os
import socket
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from aieng_core.asset_keys import SERVING_BUNDLE as KIND
from aieng_core.deploy.canary import read_history as read_canary_history
from aieng_core.deploy.rollback_readiness import last_check, pointer_rollback_target, target_integrity
from aieng_core.deploy.withdrawn import BundleWithdrawn, rollback_plan, withdrawn_from, withdrawn_refusal
from aieng_core.hashing import canonical_json
from aieng_core.store import Artifact, ArtifactIntegrityError, ArtifactNotFound, ArtifactStore, InvalidArtifactName
from aieng_core.store.artifacts import MANIFEST, validate_name
from aieng_core.store.canary_state import read_canary
from aieng_core.store.pointers import (
    PRODUCTION,
    DeploymentError,
    DeploymentStateError,
    History,
    Pointer,
    unapplied_sequences,
)
from aieng_core.store.recipes import recipe_path

__all__ = [
    "BundleWithdrawn",
    "DeploymentError",
    "DeploymentStateError",
    "Deployments",
    "default_actor",
    "withdrawn_refusal",
]

log = logging.getLogger("aieng.deploy")

CANARY_EVENTS_SHOWN = 20


def default_actor() -> str:
    """`user@host` of this process, whatever the environment lacks."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError, ImportError):  # no $USER/$LOGNAME and no passwd entry (a bare container)
        user = f"uid{os.getuid()}"
    try:
        host = socket.gethostname()
    except OSError:
        host = "unknown-host"
    return f"{user}@{host or 'unknown-host'}"


class Deployments:
    """One deployment pointer of `home` (`$AIENG_HOME`): read it, promote a bundle, roll back."""

    def __init__(self, home: Path | str, pointer: str = PRODUCTION, store: ArtifactStore | None = None) -> None:
        self.home = Path(home)
        self.files = Pointer(self.home, pointer)
        self.pointer = self.files.name
        self.store = store if store is not None else ArtifactStore(self.home)
        self.directory = self.files.directory
        self.current_path = self.files.current_path
        self.history_path = self.files.history_path
        self.lock_path = self.files.lock_path

    # ---- reading ------------------------------------------------------------------------------
    def current(self) -> dict[str, Any]:
        """current.json's content; the nothing-deployed state when the file does not exist."""
        return self.files.current()

    def current_bundle_path(self) -> Path | None:
        """The current bundle's directory in the store, or None when nothing is deployed.

        Derived from the bundle id and this store (the id is the identity; current.json's
        bundle_path records where it was when promoted, which a copied home no longer is).
        """
        bundle_id = self.current()["bundle_id"]
        if bundle_id is None:
            return None
        path = self.store.artifact_dir(KIND, bundle_id)
        if not (path / MANIFEST).is_file():
            raise DeploymentError(
                f"{self.pointer}'s current {KIND} {bundle_id} is not in the store (no {path / MANIFEST})"
            )
        return Path(os.path.abspath(path))

    def history(self) -> list[dict[str, Any]]:
        """Every change, oldest first. An incomplete last line (a crash cut an append short)
        is no record: it is left out with a warning naming it (status() reports it too); any
        other line that is not a valid event raises DeploymentStateError naming its line."""
        return self.files.read_history(warn=True).events

    def status(self) -> dict[str, Any]:
        """`{pointer, sequence, current, previous, stack, withdrawn, history, unapplied, torn_tail}`.

        `current` is `{bundle_id, bundle_path, in_store, since, sequence}` or None when
        nothing is deployed; `previous` is what a rollback would make current (withdrawn
        bundles passed over), or None: `{bundle_id, bundle_path, in_store, integrity,
        rollback_check}`, `integrity` being "ok", "missing" or the first problem of a re-hash of
        its files (naming the file; the model is not loaded), `rollback_check` the last
        readiness check (`aieng deploy check-rollback`) with `stale` (the pointer moved since),
        or None. Both paths are where this store holds the bundle (as current_bundle_path(),
        not the path recorded in current.json). `withdrawn` lists `{bundle_id, sequence, time,
        actor, reason}` of each bundle a rollback withdrew (the rollback's event). `unapplied`
        lists the sequences of history lines whose change never reached current.json (a crash
        between the two writes); `torn_tail` is `{line, bytes}` when the last line of
        history.jsonl is incomplete, else None. `canary` is the canary rollout running on the
        pointer (store/canary_state.py) or None; `canary_history` the last events of every
        rollout (deploy/canary.py: start, step, rolled_back with why, promoted, aborted).
        """
        history, current, unapplied = self.files.snapshot()
        withdrawn = withdrawn_from(_applied(history.events, unapplied))
        target = rollback_plan(current["stack"], withdrawn, current["bundle_id"])[0]
        previous = None
        if target is not None:
            previous = {
                **self._bundle_summary(target),
                "integrity": target_integrity(self.store, target),
                "rollback_check": last_check(self.home, self.pointer, current["sequence"]),
            }
        return {
            "pointer": self.pointer,
            "sequence": current["sequence"],
            "current": None
            if current["bundle_id"] is None
            else {
                **self._bundle_summary(current["bundle_id"]),
                "since": current["updated_at"],
                "sequence": current["sequence"],
            },
            "previous": previous,
            "stack": current["stack"],
            "withdrawn": [
                {"bundle_id": bundle_id, **{key: event[key] for key in ("sequence", "time", "actor", "reason")}}
                for bundle_id, event in sorted(withdrawn.items(), key=lambda item: item[1]["sequence"])
            ],
            "history": history.events,
            "unapplied": unapplied,
            "torn_tail": {"line": history.torn_line, "bytes": len(history.torn)} if history.torn else None,
            "canary": read_canary(self.home, self.pointer),
            "canary_history": read_canary_history(self.home, self.pointer)[-CANARY_EVENTS_SHOWN:],
        }

    def withdrawn(self) -> dict[str, dict[str, Any]]:
        """bundle id -> the applied rollback event that withdrew it (deploy/withdrawn.py)."""
        return withdrawn_from(self.files.applied()[1])

    def withdrawal(self, bundle_id: str) -> dict[str, Any] | None:
        """The rollback event that withdrew `bundle_id`, or None when it is not withdrawn."""
        return self.withdrawn().get(bundle_id)

    def refuse_withdrawn(self, bundle_id: str) -> None:
        """BundleWithdrawn, naming the rollback, when a rollback withdrew `bundle_id`."""
        event = self.withdrawal(bundle_id)
        if event is not None:
            raise BundleWithdrawn(bundle_id, event, self.pointer)

    def rollback_target(self) -> str | None:
        """What a rollback would make current now (the stack's top, withdrawn bundles passed
        over), or None."""
        return pointer_rollback_target(self.files)[1]

    # ---- changing ---------------------------------------------------------------------------
    def promote(
        self,
        bundle_id: str,
        *,
        actor: str | None = None,
        reason: str = "",
        figures: dict[str, Any] | None = None,
        dagster_run_id: str | None = None,
        verify: bool = True,
        expected_sequence: int | None = None,
        allow_withdrawn: bool = False,
    ) -> dict[str, Any]:
        """Make `bundle_id` (a serving_bundle in the store) current; the old current goes on
        the stack. A bundle a rollback withdrew is refused (BundleWithdrawn, naming the
        rollback) unless `allow_withdrawn`, which the event records (`allow_withdrawn`, and
        `overrode_withdrawal`: the sequence of the rollback overridden, or None). With
        `verify`, the bundle is re-hashed, loaded and its goldens replayed first. With
        `expected_sequence`, the promote happens only if the pointer is still at that
        sequence when the lock is taken (the gate: a rollback made by hand while it ran must
        not be overwritten). Returns the history event; refusals raise DeploymentError and
        change nothing."""
        fields = _event_fields(actor, reason, figures, dagster_run_id)
        if not isinstance(allow_withdrawn, bool):
            raise DeploymentError(f"allow_withdrawn must be True or False, not {allow_withdrawn!r}")
        refusal = f"cannot promote {bundle_id!r} on {self.pointer}"
        artifact = self._bundle(bundle_id, refusal)
        # Fail fast, before the slow verification; both are checked again under the lock.
        self._refuse_current(self.current(), bundle_id)
        if not allow_withdrawn:
            self.refuse_withdrawn(bundle_id)
        # Held from before it is verified until the pointer names it: until then no root
        # reaches it, and `aieng store gc` must not take it meanwhile.
        with self._hold(artifact, refusal):
            if verify:
                self._verify(artifact, f"refusing to promote {KIND} {artifact.id} on {self.pointer}")
            return self._commit_promote(artifact, expected_sequence, allow_withdrawn, fields)

    def _commit_promote(
        self, artifact: Artifact, expected_sequence: int | None, allow_withdrawn: bool, fields: dict[str, Any]
    ) -> dict[str, Any]:
        bundle_id = artifact.id
        # Verification reads only the immutable bundle, so it runs outside the lock.
        with self.files.locked():
            history, current = self.files.read_history(warn=False), self.current()
            if expected_sequence is not None and current["sequence"] != expected_sequence:
                raise DeploymentError(
                    f"{self.pointer} changed while {bundle_id} was being checked: it was at sequence "
                    f"{expected_sequence} and is now at {current['sequence']} ({current['bundle_id']}); nothing changed"
                )
            self._refuse_current(current, bundle_id)
            withdrawal = _withdrawn_now(history, current).get(bundle_id)
            if withdrawal is not None and not allow_withdrawn:
                raise BundleWithdrawn(bundle_id, withdrawal, self.pointer)
            fields["allow_withdrawn"] = allow_withdrawn
            fields["overrode_withdrawal"] = None if withdrawal is None else withdrawal["sequence"]
            stack = list(current["stack"])
            if current["bundle_id"] is not None:
                stack.append(current["bundle_id"])
            path = os.path.abspath(artifact.path)
            return self.files.commit(history, "promote", current, bundle_id, path, stack, fields)

    def rollback(
        self,
        *,
        actor: str | None = None,
        reason: str = "",
        allow_empty: bool = False,
        figures: dict[str, Any] | None = None,
        dagster_run_id: str | None = None,
        verify: bool = True,
    ) -> dict[str, Any]:
        """Make the top of the stack current again (popping it), and withdraw the bundle it
        leaves (the event's `withdrawn`). Withdrawn bundles on top of the stack are passed
        over (popped, listed in `skipped_withdrawn`): a rollback never lands on one. With
        `verify`, the target is re-hashed, loaded and its goldens replayed before the pointer
        moves (outside the lock: then, under it, the target must still be the same). With no
        bundle left to roll back to, `allow_empty` rolls back to no bundle at all (the gate's
        drill on a first deployment). Returns the history event; refusals raise
        DeploymentError and change nothing."""
        fields = _event_fields(actor, reason, figures, dagster_run_id)
        with ExitStack() as holds:  # the target, held until the pointer names it (see promote)
            return self._rollback(holds, allow_empty, verify, fields)

    def _rollback(self, holds: ExitStack, allow_empty: bool, verify: bool, fields: dict[str, Any]) -> dict[str, Any]:
        checked: str | None = None
        if verify:
            history, current, unapplied = self.files.snapshot()
            withdrawn = withdrawn_from(_applied(history.events, unapplied))
            checked = self._rollback_plan(current, withdrawn, allow_empty)[0]
            if checked is not None:
                refusal = f"cannot roll {self.pointer} back to {checked!r}"
                artifact = self._bundle(checked, refusal, deployed=True)
                holds.enter_context(self._hold(artifact, refusal))
                self._verify(artifact, f"refusing to roll {self.pointer} back to {KIND} {checked}")
        with self.files.locked():
            # Both files are read (and checked) first: a damaged one refuses every change.
            history, current = self.files.read_history(warn=False), self.current()
            target, stack, skipped = self._rollback_plan(current, _withdrawn_now(history, current), allow_empty)
            if verify and target != checked:
                raise DeploymentError(
                    f"{self.pointer} changed while {checked} was being checked: a rollback now goes to "
                    f"{target or 'no bundle'} (sequence {current['sequence']}); nothing changed"
                )
            path: str | None = None
            if target is not None:
                refusal = f"cannot roll {self.pointer} back to {target!r}"
                artifact = self._bundle(target, refusal, deployed=True)
                holds.enter_context(self._hold(artifact, refusal))
                path = os.path.abspath(artifact.path)
            fields["withdrawn"] = current["bundle_id"]
            fields["skipped_withdrawn"] = skipped
            return self.files.commit(history, "rollback", current, target, path, stack, fields)

    # ---- internals --------------------------------------------------------------------------
    def _bundle(self, bundle_id: Any, refusal: str, deployed: bool = False) -> Artifact:
        """The serving_bundle artifact `bundle_id`, or a DeploymentError starting `refusal`.
        `deployed`: the pointer's stack names it (a rollback target), so it was in the store."""
        try:
            validate_name(bundle_id, "bundle id")
            artifact = self.store.get(KIND, bundle_id)
        except InvalidArtifactName as exc:
            raise DeploymentError(f"{refusal}: {exc}") from None
        except ArtifactNotFound:
            hint = ""
            try:
                other = self.store.find(bundle_id)
                hint = f" ({bundle_id} is a {other.kind}, not a {KIND})"
            except ArtifactNotFound:
                pass
            missing = self.store.artifact_dir(KIND, bundle_id) / MANIFEST
            # `aieng bundle build` bundles the current model and config, another recipe and so
            # another id: only `aieng store rebuild` brings back this very bundle, from its recipe.
            restore = (
                f"restore {missing.parent}/ from a backup (`aieng store gc` never deletes a bundle a pointer "
                "can roll back to)"
            )
            if not deployed:
                remedy = "`aieng bundle build` builds one, `aieng bundle current` names the newest"
            elif recipe_path(self.store.home, KIND, bundle_id).is_file():
                remedy = (
                    f"it is gone from the store: `aieng store rebuild {bundle_id}` rebuilds that exact bundle from "
                    "its recorded recipe (`aieng bundle build` would build a new bundle, with a new id), or " + restore
                )
            else:
                remedy = (
                    "it is gone from the store and no recipe for it is recorded, so neither `aieng store rebuild` "
                    "nor `aieng bundle build` (a new bundle, with a new id) can bring it back: " + restore
                )
            raise DeploymentError(
                f"{refusal}: no {KIND} {bundle_id!r} in {self.store.root / KIND} ({missing} is missing){hint}; {remedy}"
            ) from None
        except ArtifactIntegrityError as exc:
            raise DeploymentError(f"{refusal}: {exc}") from None
        manifest_id = artifact.manifest.get("id") if isinstance(artifact.manifest, dict) else None
        if manifest_id != bundle_id:
            raise DeploymentError(
                f"{refusal}: {artifact.path / MANIFEST} names id {manifest_id!r}, not {bundle_id!r} "
                "(a bundle copied under another id)"
            )
        return artifact

    def _hold(self, artifact: Artifact, refusal: str) -> ExitStack:
        """store.hold(artifact), refused with a DeploymentError if it left the store meanwhile."""
        holds = ExitStack()
        try:
            holds.enter_context(self.store.hold(artifact))
        except ArtifactNotFound as exc:
            raise DeploymentError(f"{refusal}: {exc}; nothing changed") from None
        return holds

    def _bundle_summary(self, bundle_id: str) -> dict[str, Any]:
        path = self.store.artifact_dir(KIND, bundle_id)
        return {
            "bundle_id": bundle_id,
            "bundle_path": os.path.abspath(path),
            "in_store": (path / MANIFEST).is_file(),
        }

    def _refuse_current(self, current: dict[str, Any], bundle_id: str) -> None:
        if current["bundle_id"] == bundle_id:
            raise DeploymentError(
                f"{KIND} {bundle_id} is already current on {self.pointer} "
                f"(since {current['updated_at']}, sequence {current['sequence']}); nothing changed"
            )

    def _rollback_plan(
        self, current: dict[str, Any], withdrawn: dict[str, dict[str, Any]], allow_empty: bool
    ) -> tuple[str | None, list[str], list[str]]:
        """(target, stack after, withdrawn entries passed over), or the refusal."""
        if current["bundle_id"] is None and not current["stack"]:
            raise DeploymentError(f"nothing is deployed on {self.pointer}: there is nothing to roll back")
        target, stack, skipped = rollback_plan(current["stack"], withdrawn, current["bundle_id"])
        if target is None and not allow_empty:
            if skipped:
                why = f"the bundles on {self.pointer}'s stack ({', '.join(skipped)}) are withdrawn or current"
            else:
                why = f"{current['bundle_id']} is the only bundle deployed on {self.pointer}"
            raise DeploymentError(
                f"nothing to roll back to: {why} (allow_empty / --allow-empty rolls back to no bundle at all)"
            )
        return target, stack, skipped

    def _verify(self, artifact: Artifact, refusal: str) -> None:
        """Re-hash, load and replay the goldens of `artifact`; DeploymentError starting
        `refusal` and naming the first problem (the file) when it does not verify."""
        from aieng_core.bundle.verify import verify_bundle

        report = verify_bundle(artifact.path)
        if not report["ok"]:
            problems = report["problems"] or ["verification failed"]
            more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
            raise DeploymentError(
                f"{refusal}: {problems[0]}{more}; nothing changed "
                f"(`aieng bundle verify {artifact.path}` lists every problem)"
            )


def _applied(events: list[dict[str, Any]], unapplied: list[int]) -> list[dict[str, Any]]:
    skipped = set(unapplied)
    return [event for event in events if event["sequence"] not in skipped]


def _withdrawn_now(history: History, current: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """What is withdrawn, from the two files read under the lock."""
    return withdrawn_from(_applied(history.events, unapplied_sequences(history.events, current)))


def _event_fields(
    actor: str | None, reason: str, figures: dict[str, Any] | None, dagster_run_id: str | None
) -> dict[str, Any]:
    """The caller's part of an event, checked before anything is read, verified or locked."""
    fields = {
        "actor": default_actor() if actor is None else actor,
        "reason": reason,
        "figures": {} if figures is None else figures,
        "dagster_run_id": dagster_run_id,
    }
    for key in ("actor", "reason"):
        if not isinstance(fields[key], str):
            raise DeploymentError(f"{key} must be a string, not {fields[key]!r}")
    if dagster_run_id is not None and not isinstance(dagster_run_id, str):
        raise DeploymentError(f"dagster_run_id must be a string or None, not {dagster_run_id!r}")
    if not isinstance(fields["figures"], dict):
        raise DeploymentError(f"figures must be a mapping, not {type(fields['figures']).__name__}")
    try:
        canonical_json(fields["figures"])
    except (TypeError, ValueError) as exc:
        raise DeploymentError(f"figures must be plain JSON (no NaN or infinity): {exc}") from None
    return fields

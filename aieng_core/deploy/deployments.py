"""Deployment policy: which changes of a pointer are allowed, and how they are made.

A pointer's files (current.json, history.jsonl, the lock: store/pointers.py says the format)
only change through `Deployments`: a promote names a serving bundle that exists in the store,
carries its own id and (unless told otherwise) verifies, never the one already current; a
rollback pops the stack back to a bundle that exists. Every refusal raises DeploymentError
and changes nothing.
"""

from __future__ import annotations

import getpass
import logging
import os
import socket
from pathlib import Path
from typing import Any

from aieng_core.asset_keys import SERVING_BUNDLE as KIND
from aieng_core.hashing import canonical_json
from aieng_core.store import Artifact, ArtifactIntegrityError, ArtifactNotFound, ArtifactStore, InvalidArtifactName
from aieng_core.store.artifacts import MANIFEST, validate_name
from aieng_core.store.pointers import (
    PRODUCTION,
    DeploymentError,
    DeploymentStateError,
    Pointer,
)

__all__ = ["DeploymentError", "DeploymentStateError", "Deployments", "default_actor"]

log = logging.getLogger("aieng.deploy")


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
        """`{pointer, sequence, current, previous, stack, history, unapplied, torn_tail}`.

        `current` is `{bundle_id, bundle_path, in_store, since, sequence}` or None when
        nothing is deployed; `previous` (`{bundle_id, bundle_path, in_store}` or None) is what
        a rollback would make current. Both paths are where this store holds the bundle (as
        current_bundle_path(), not the path recorded in current.json). `unapplied` lists the
        sequences of history lines whose change never reached current.json (a crash between
        the two writes); `torn_tail` is `{line, bytes}` when the last line of history.jsonl is
        incomplete, else None.
        """
        history, current, unapplied = self.files.snapshot()
        stack = current["stack"]
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
            "previous": None if not stack else self._bundle_summary(stack[-1]),
            "stack": stack,
            "history": history.events,
            "unapplied": unapplied,
            "torn_tail": {"line": history.torn_line, "bytes": len(history.torn)} if history.torn else None,
        }

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
    ) -> dict[str, Any]:
        """Make `bundle_id` (a serving_bundle in the store) current; the old current goes on
        the stack. With `verify`, the bundle is re-hashed, loaded and its goldens replayed
        first. With `expected_sequence`, the promote happens only if the pointer is still at
        that sequence when the lock is taken (the gate: a rollback made by hand while it ran
        must not be overwritten). Returns the history event; refusals raise DeploymentError
        and change nothing."""
        fields = _event_fields(actor, reason, figures, dagster_run_id)
        artifact = self._bundle(bundle_id, f"cannot promote {bundle_id!r} on {self.pointer}")
        self._refuse_current(self.current(), bundle_id)  # fail fast, before the slow verification
        if verify:
            self._verify(artifact)
        # Verification reads only the immutable bundle, so it runs outside the lock.
        with self.files.locked():
            history, current = self.files.read_history(warn=False), self.current()
            if expected_sequence is not None and current["sequence"] != expected_sequence:
                raise DeploymentError(
                    f"{self.pointer} changed while {bundle_id} was being checked: it was at sequence "
                    f"{expected_sequence} and is now at {current['sequence']} ({current['bundle_id']}); nothing changed"
                )
            self._refuse_current(current, bundle_id)
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
    ) -> dict[str, Any]:
        """Make the top of the stack current again (popping it). With an empty stack,
        `allow_empty` rolls back to no bundle at all (the gate's drill on a first
        deployment). Returns the history event; refusals raise DeploymentError."""
        fields = _event_fields(actor, reason, figures, dagster_run_id)
        with self.files.locked():
            # Both files are read (and checked) first: a damaged one refuses every change.
            history, current = self.files.read_history(warn=False), self.current()
            stack = list(current["stack"])
            path: str | None = None
            if stack:
                target: str | None = stack.pop()
                artifact = self._bundle(target, f"cannot roll {self.pointer} back to {target!r}")
                path = os.path.abspath(artifact.path)
            elif current["bundle_id"] is None:
                raise DeploymentError(f"nothing is deployed on {self.pointer}: there is nothing to roll back")
            elif allow_empty:
                target = None
            else:
                raise DeploymentError(
                    f"nothing to roll back to: {current['bundle_id']} is the only bundle deployed on "
                    f"{self.pointer} (allow_empty / --allow-empty rolls back to no bundle at all)"
                )
            return self.files.commit(history, "rollback", current, target, path, stack, fields)

    # ---- internals --------------------------------------------------------------------------
    def _bundle(self, bundle_id: Any, refusal: str) -> Artifact:
        """The serving_bundle artifact `bundle_id`, or a DeploymentError starting `refusal`."""
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
            raise DeploymentError(
                f"{refusal}: no {KIND} {bundle_id!r} in {self.store.root / KIND}{hint}; "
                "`aieng bundle build` builds one, `aieng bundle current` names the newest"
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

    def _verify(self, artifact: Artifact) -> None:
        from aieng_core.bundle.verify import verify_bundle

        report = verify_bundle(artifact.path)
        if not report["ok"]:
            problems = report["problems"] or ["verification failed"]
            more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
            raise DeploymentError(
                f"refusing to promote {KIND} {artifact.id} on {self.pointer}: {problems[0]}{more}; nothing changed "
                f"(`aieng bundle verify {artifact.path}` lists every problem)"
            )


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

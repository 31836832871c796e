"""Deployment pointers: which serving bundle is current, switched atomically, with a history.

Each pointer is a directory `$AIENG_HOME/deployments/<pointer>/` (production by default; the
gate's rollback drill uses a pointer of its own and never touches production's) holding:

- `current.json`: `{pointer, bundle_id, bundle_path, sequence, updated_at, stack}`, replaced
  atomically, so a reader never needs a lock and never sees half of it. `stack` holds the
  bundles that were current before, oldest first: a rollback pops its top. A missing file
  means nothing was ever deployed (bundle_id null, sequence 0, empty stack).
- `history.jsonl`: one JSON object per change, `{sequence, time, pointer, action, from, to,
  actor, reason, figures, dagster_run_id}`, appended with O_APPEND and fsynced, never rewritten.
  Sequence numbers strictly increase; current.json's `sequence` is that of the last change
  applied.
- `.lock`: every change holds an exclusive flock on it for its whole read-modify-write.

current.json is the truth about what is deployed. A history line whose change never reached
current.json (a crash between the two writes) is reported by `status()` as "unapplied".
"""

from __future__ import annotations

import datetime as dt
import fcntl
import getpass
import json
import logging
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aieng_core.bundle.serving_bundle import KIND
from aieng_core.faults import crash_point
from aieng_core.hashing import canonical_json
from aieng_core.store import Artifact, ArtifactIntegrityError, ArtifactNotFound, ArtifactStore, InvalidArtifactName
from aieng_core.store.artifacts import MANIFEST, is_valid_name, validate_name
from aieng_core.store.atomic import atomic_write_bytes, fsync_path

DEFAULT_POINTER = "production"
DEPLOYMENTS_DIR = "deployments"
CURRENT_FILE = "current.json"
HISTORY_FILE = "history.jsonl"
LOCK_FILE = ".lock"
ACTIONS = ("promote", "rollback")

CURRENT_KEYS = ("pointer", "bundle_id", "bundle_path", "sequence", "updated_at", "stack")
REPAIR_CURRENT = "restore it by hand (it is never overwritten while damaged)"
REPAIR_HISTORY = "repair the line by hand (nothing is changed while the history is damaged)"
EVENT_KEYS = ("sequence", "time", "pointer", "action", "from", "to", "actor", "reason", "figures", "dagster_run_id")

log = logging.getLogger("aieng.deploy")


class DeploymentError(ValueError):
    """A change the deployment state refuses, with a message a user can act on. Nothing was
    changed. (A ValueError, so `aieng` prints it as one line and exits 1.)"""


class DeploymentStateError(DeploymentError):
    """A deployment file is damaged. It is named, and never overwritten while damaged."""


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


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")


def _is_int(value: Any) -> bool:
    return type(value) is int  # not bool


def _is_name_or_none(value: Any) -> bool:
    return value is None or (isinstance(value, str) and is_valid_name(value))


def _current_problem(doc: Any, pointer: str) -> str | None:
    """Why a parsed current.json is not a valid state of `pointer`, or None."""
    if not isinstance(doc, dict):
        return "not a JSON object"
    missing = [key for key in CURRENT_KEYS if key not in doc]
    if missing:
        return f"missing {', '.join(missing)}"
    if doc["pointer"] != pointer:
        return f"pointer is {doc['pointer']!r}, not {pointer!r}"
    if not _is_name_or_none(doc["bundle_id"]):
        return f"bundle_id {doc['bundle_id']!r} is not null or a valid bundle id"
    if doc["bundle_path"] is not None and not isinstance(doc["bundle_path"], str):
        return f"bundle_path {doc['bundle_path']!r} is not null or a string"
    if (doc["bundle_id"] is None) != (doc["bundle_path"] is None):
        return "bundle_id and bundle_path must both be null or both be set"
    if not _is_int(doc["sequence"]) or doc["sequence"] < 0:
        return f"sequence {doc['sequence']!r} is not a non-negative integer"
    if not isinstance(doc["updated_at"], str):
        return f"updated_at {doc['updated_at']!r} is not a string"
    stack = doc["stack"]
    if not isinstance(stack, list) or not all(isinstance(item, str) and is_valid_name(item) for item in stack):
        return f"stack {stack!r} is not a list of valid bundle ids"
    return None


def _event_problem(event: Any, pointer: str) -> str | None:
    """Why a parsed history line is not a valid event of `pointer`, or None."""
    if not isinstance(event, dict):
        return "not a JSON object"
    missing = [key for key in EVENT_KEYS if key not in event]
    if missing:
        return f"missing {', '.join(missing)}"
    if not _is_int(event["sequence"]) or event["sequence"] < 1:
        return f"sequence {event['sequence']!r} is not a positive integer"
    if event["pointer"] != pointer:
        return f"pointer is {event['pointer']!r}, not {pointer!r}"
    if event["action"] not in ACTIONS:
        return f"action {event['action']!r} is not one of {', '.join(ACTIONS)}"
    for key in ("from", "to"):
        if not _is_name_or_none(event[key]):
            return f"{key} {event[key]!r} is not null or a valid bundle id"
    for key in ("time", "actor", "reason"):
        if not isinstance(event[key], str):
            return f"{key} {event[key]!r} is not a string"
    if not isinstance(event["figures"], dict):
        return "figures is not a JSON object"
    if event["dagster_run_id"] is not None and not isinstance(event["dagster_run_id"], str):
        return f"dagster_run_id {event['dagster_run_id']!r} is not null or a string"
    return None


def unapplied_sequences(events: list[dict[str, Any]], current: dict[str, Any]) -> list[int]:
    """Sequences of history lines whose change never reached current.json.

    Every applied change starts where the applied one before it ended (its `from` is the
    bundle current.json named when it was made), and no change goes from a bundle to itself.
    So a line followed by one that starts where it started, not where it ended, was never
    applied; the last line is applied when current.json's sequence has reached it.
    """
    unapplied = []
    state: str | None = None  # what was current after the last change known to be applied
    pending: dict[str, Any] | None = None  # the line before: applied unless the next line says not
    for event in events:
        if pending is not None:
            if event["from"] != pending["to"] and event["from"] == state:
                unapplied.append(pending["sequence"])
            else:
                state = pending["to"]
        pending = event
    if pending is not None and pending["sequence"] > current["sequence"]:
        unapplied.append(pending["sequence"])
    return unapplied


@dataclass(frozen=True)
class _History:
    events: list[dict[str, Any]]
    complete_bytes: int  # the length of the complete (newline-terminated) lines
    torn: bytes  # an incomplete last line: an append a crash cut short, never a record
    torn_line: int  # its line number (1-based)


class Deployments:
    """One deployment pointer of `home` (`$AIENG_HOME`): read it, promote a bundle, roll back."""

    def __init__(self, home: Path | str, pointer: str = DEFAULT_POINTER, store: ArtifactStore | None = None) -> None:
        self.home = Path(home)
        try:
            self.pointer = validate_name(pointer, "deployment pointer")
        except InvalidArtifactName as exc:
            raise DeploymentError(str(exc)) from None
        self.store = store if store is not None else ArtifactStore(self.home)
        self.directory = self.home / DEPLOYMENTS_DIR / self.pointer
        self.current_path = self.directory / CURRENT_FILE
        self.history_path = self.directory / HISTORY_FILE
        self.lock_path = self.directory / LOCK_FILE

    # ---- reading (no lock: current.json is replaced atomically, history only grows) -------
    def current(self) -> dict[str, Any]:
        """current.json's content; the nothing-deployed state when the file does not exist."""
        try:
            data = self.current_path.read_bytes()
        except FileNotFoundError:
            return {
                "pointer": self.pointer,
                "bundle_id": None,
                "bundle_path": None,
                "sequence": 0,
                "updated_at": None,
                "stack": [],
            }
        except OSError as exc:
            raise DeploymentStateError(f"{self.current_path}: unreadable: {exc.strerror}") from None
        try:
            doc = json.loads(data)
        except ValueError as exc:
            raise DeploymentStateError(f"{self.current_path}: not valid JSON ({exc}); {REPAIR_CURRENT}") from None
        problem = _current_problem(doc, self.pointer)
        if problem is not None:
            raise DeploymentStateError(f"{self.current_path}: {problem}; {REPAIR_CURRENT}")
        return doc

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
        return self._read_history(warn=True).events

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
        # History before current.json, the reverse of a change's order: a line read here whose
        # change is not in the current.json read after it crashed, or is being applied now.
        history, current = self._read_history(warn=True), self.current()
        unapplied = unapplied_sequences(history.events, current)
        if unapplied and unapplied[-1] == history.events[-1]["sequence"] and self.lock_path.exists():
            # A change may be between its two writes right now: wait for it, then read again.
            with self._locked(fcntl.LOCK_SH):
                history, current = self._read_history(warn=False), self.current()
                unapplied = unapplied_sequences(history.events, current)
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
        with self._locked(fcntl.LOCK_EX):
            history, current = self._read_history(warn=False), self.current()
            if expected_sequence is not None and current["sequence"] != expected_sequence:
                raise DeploymentError(
                    f"{self.pointer} changed while {bundle_id} was being checked: it was at sequence "
                    f"{expected_sequence} and is now at {current['sequence']} ({current['bundle_id']}); nothing changed"
                )
            self._refuse_current(current, bundle_id)
            stack = list(current["stack"])
            if current["bundle_id"] is not None:
                stack.append(current["bundle_id"])
            return self._commit(history, "promote", current, bundle_id, artifact, stack, fields)

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
        with self._locked(fcntl.LOCK_EX):
            # Both files are read (and checked) first: a damaged one refuses every change.
            history, current = self._read_history(warn=False), self.current()
            stack = list(current["stack"])
            artifact: Artifact | None = None
            if stack:
                target: str | None = stack.pop()
                artifact = self._bundle(target, f"cannot roll {self.pointer} back to {target!r}")
            elif current["bundle_id"] is None:
                raise DeploymentError(f"nothing is deployed on {self.pointer}: there is nothing to roll back")
            elif allow_empty:
                target = None
            else:
                raise DeploymentError(
                    f"nothing to roll back to: {current['bundle_id']} is the only bundle deployed on "
                    f"{self.pointer} (allow_empty / --allow-empty rolls back to no bundle at all)"
                )
            return self._commit(history, "rollback", current, target, artifact, stack, fields)

    # ---- internals --------------------------------------------------------------------------
    @contextmanager
    def _locked(self, mode: int) -> Iterator[None]:
        """Hold flock `mode` on the pointer's .lock (a shared one only waits out a change)."""
        if mode == fcntl.LOCK_SH:
            fd = os.open(self.lock_path, os.O_RDONLY)  # a reader needs no write access
        else:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, mode)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the lock

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

    def _read_history(self, warn: bool) -> _History:
        try:
            data = self.history_path.read_bytes()
        except FileNotFoundError:
            return _History([], 0, b"", 0)
        except OSError as exc:
            raise DeploymentStateError(f"{self.history_path}: unreadable: {exc.strerror}") from None
        complete_bytes = data.rfind(b"\n") + 1
        lines = data[:complete_bytes].split(b"\n")[:-1]
        torn = data[complete_bytes:]
        events: list[dict[str, Any]] = []
        for number, raw in enumerate(lines, start=1):
            where = f"{self.history_path}, line {number}"
            try:
                event = json.loads(raw)
            except ValueError as exc:
                raise DeploymentStateError(f"{where}: not a JSON event ({exc}); {REPAIR_HISTORY}") from None
            problem = _event_problem(event, self.pointer)
            if problem is None and events and event["sequence"] <= events[-1]["sequence"]:
                problem = f"sequence {event['sequence']} does not follow {events[-1]['sequence']}"
            if problem is not None:
                raise DeploymentStateError(f"{where}: {problem}; {REPAIR_HISTORY}")
            events.append(event)
        torn_line = len(lines) + 1 if torn else 0
        if torn and warn:
            log.warning(
                f"{self.history_path}, line {torn_line}: incomplete last line ({len(torn)} bytes, no newline): "
                "an append a crash cut short, not a record; left out (the next change moves it aside)"
            )
        return _History(events, complete_bytes, torn, torn_line)

    def _set_torn_tail_aside(self, history: _History) -> None:
        """Keep the bytes of an append a crash cut short beside the history, then cut them off,
        so the next line does not continue them. They never were a record: a change writes its
        history line before current.json, so the change they began was never applied."""
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%fZ")
        aside = self.directory / f"{HISTORY_FILE}.torn-line{history.torn_line}-{stamp}"
        atomic_write_bytes(aside, history.torn)
        log.warning(f"{self.history_path}, line {history.torn_line}: incomplete last line moved to {aside}")
        os.truncate(self.history_path, history.complete_bytes)
        fsync_path(self.history_path)

    def _append_history(self, line: bytes) -> None:
        created = not self.history_path.exists()
        fd = os.open(self.history_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            view = memoryview(line)
            while view:
                written = os.write(fd, view)
                view = view[written:]
            os.fsync(fd)
        finally:
            os.close(fd)
        if created:
            fsync_path(self.directory)

    def _commit(
        self,
        history: _History,
        action: str,
        current: dict[str, Any],
        target: str | None,
        artifact: Artifact | None,
        stack: list[str],
        fields: dict[str, Any],
    ) -> dict[str, Any]:
        """Record and apply one change; the caller holds the exclusive lock and read both files."""
        if history.torn:
            self._set_torn_tail_aside(history)
        # After a crash between the two writes the history is ahead of current.json: its
        # dangling line keeps its sequence number, which is never used again.
        last = history.events[-1]["sequence"] if history.events else 0
        sequence = max(current["sequence"], last) + 1
        now = _now()
        event = {
            "sequence": sequence,
            "time": now,
            "pointer": self.pointer,
            "action": action,
            "from": current["bundle_id"],
            "to": target,
            **fields,
        }
        state = {
            "pointer": self.pointer,
            "bundle_id": target,
            "bundle_path": None if artifact is None else os.path.abspath(artifact.path),
            "sequence": sequence,
            "updated_at": now,
            "stack": stack,
        }
        # History first, then current.json. Had current.json been replaced first, a crash
        # before the append would leave a bundle serving that no history line accounts for
        # (who, why, from what). This order makes every change of current.json have its line;
        # the worst a crash leaves is a line (sequence above current.json's) whose change was
        # never applied: current.json stays the truth and status() reports the line as unapplied.
        self._append_history(canonical_json(event) + b"\n")
        crash_point("deploy.history_appended")
        atomic_write_bytes(self.current_path, canonical_json(state))
        return event


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

"""Deployment pointers on disk: the format, read, validated and appended.

Each pointer is a directory `$AIENG_HOME/deployments/<pointer>/` (`production` serves; the
gate's rollback drill uses a pointer of its own) holding:

- `current.json`: `{pointer, bundle_id, bundle_path, sequence, updated_at, stack}`, replaced
  atomically, so a reader never needs a lock and never sees half of it. `stack` holds the
  bundles that were current before, oldest first: a rollback pops its top. A missing file
  means nothing was ever deployed (bundle_id null, sequence 0, empty stack).
- `history.jsonl`: one JSON object per change, `{sequence, time, pointer, action, from, to,
  actor, reason, figures, dagster_run_id}`, appended with O_APPEND and fsynced, never rewritten.
  Sequence numbers strictly increase; current.json's `sequence` is that of the last change
  applied. Later events carry the deploy policy's withdrawal keys too (deploy/withdrawn.py):
  a rollback's `withdrawn` (the bundle it left) and `skipped_withdrawn`, a promote's
  `allow_withdrawn` and `overrode_withdrawal`; older lines without them stay valid.
- `.lock`: every change holds an exclusive flock on it for its whole read-modify-write.

current.json is the truth about what is deployed. A history line whose change never reached
current.json (a crash between the two writes) is "unapplied".

This module is the format and nothing else: which changes are allowed (a bundle that exists
and verifies, a stack to roll back to) is the deploy package's policy, built on `Pointer`.
It sits in the store layer because everything reads it: the deploy policy, `aieng store
verify`, lineage, and the server that follows a pointer.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aieng_core.faults import crash_point
from aieng_core.hashing import canonical_json
from aieng_core.store.artifacts import InvalidArtifactName, is_valid_name, validate_name
from aieng_core.store.atomic import atomic_write_bytes, fsync_path

DEPLOYMENTS_DIR = "deployments"  # under $AIENG_HOME
PRODUCTION = "production"  # the pointer that serves
CURRENT_FILE = "current.json"
HISTORY_FILE = "history.jsonl"
LOCK_FILE = ".lock"
# Folders of deployments/ that are not pointers: a pointer of that name would write into them.
GATE_REPORTS_DIR = "gate-reports"
RESERVED_NAMES = (GATE_REPORTS_DIR,)
ACTIONS = ("promote", "rollback")

CURRENT_KEYS = ("pointer", "bundle_id", "bundle_path", "sequence", "updated_at", "stack")
EVENT_KEYS = ("sequence", "time", "pointer", "action", "from", "to", "actor", "reason", "figures", "dagster_run_id")
REPAIR_CURRENT = "restore it by hand (it is never overwritten while damaged)"
REPAIR_HISTORY = "repair the line by hand (nothing is changed while the history is damaged)"

log = logging.getLogger("aieng.deploy")


class DeploymentError(ValueError):
    """A change the deployment state refuses, with a message a user can act on. Nothing was
    changed. (A ValueError, so `aieng` prints it as one line and exits 1.)"""


class DeploymentStateError(DeploymentError):
    """A deployment file is damaged. It is named, and never overwritten while damaged."""


def deployments_dir(home: Path | str) -> Path:
    return Path(home) / DEPLOYMENTS_DIR


def validate_pointer_name(name: Any) -> str:
    """`name` if it can name a pointer; DeploymentError saying why not."""
    try:
        validate_name(name, "deployment pointer")
    except InvalidArtifactName as exc:
        raise DeploymentError(str(exc)) from None
    if name in RESERVED_NAMES:
        raise DeploymentError(
            f"deployment pointer {name!r} is reserved: $AIENG_HOME/{DEPLOYMENTS_DIR}/{name}/ holds the gate's reports; "
            "choose another name"
        )
    return str(name)


def pointer_names(home: Path | str) -> list[str]:
    """Every pointer that was ever switched under `home` (a directory with a current.json)."""
    directory = deployments_dir(home)
    if not directory.is_dir():
        return []
    return sorted(
        entry.name
        for entry in directory.iterdir()
        if entry.name not in RESERVED_NAMES
        and is_valid_name(entry.name)
        and entry.is_dir()
        and not entry.is_symlink()
        and (entry / CURRENT_FILE).is_file()
    )


def _is_int(value: Any) -> bool:
    return type(value) is int  # not bool


def _is_name_or_none(value: Any) -> bool:
    return value is None or (isinstance(value, str) and is_valid_name(value))


def current_problem(doc: Any, pointer: str) -> str | None:
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


def event_problem(event: Any, pointer: str) -> str | None:
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
    return _withdrawal_keys_problem(event)


def _withdrawal_keys_problem(event: dict[str, Any]) -> str | None:
    """The optional withdrawal keys (absent from older lines), checked when present."""
    if "withdrawn" in event and not _is_name_or_none(event["withdrawn"]):
        return f"withdrawn {event['withdrawn']!r} is not null or a valid bundle id"
    skipped = event.get("skipped_withdrawn", [])
    if not isinstance(skipped, list) or not all(isinstance(item, str) and is_valid_name(item) for item in skipped):
        return f"skipped_withdrawn {skipped!r} is not a list of valid bundle ids"
    if "allow_withdrawn" in event and type(event["allow_withdrawn"]) is not bool:
        return f"allow_withdrawn {event['allow_withdrawn']!r} is not true or false"
    overrode = event.get("overrode_withdrawal")
    if overrode is not None and (not _is_int(overrode) or overrode < 1):
        return f"overrode_withdrawal {overrode!r} is not null or a positive integer"
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
class History:
    events: list[dict[str, Any]]
    complete_bytes: int  # the length of the complete (newline-terminated) lines
    torn: bytes  # an incomplete last line: an append a crash cut short, never a record
    torn_line: int  # its line number (1-based)


class Pointer:
    """The files of one deployment pointer of `home`: read them, and commit one change."""

    def __init__(self, home: Path | str, name: str = PRODUCTION) -> None:
        self.name = validate_pointer_name(name)
        self.directory = deployments_dir(home) / self.name
        self.current_path = self.directory / CURRENT_FILE
        self.history_path = self.directory / HISTORY_FILE
        self.lock_path = self.directory / LOCK_FILE

    # ---- reading (no lock: current.json is replaced atomically, history only grows) -------
    def current(self) -> dict[str, Any]:
        """current.json's content, validated; the nothing-deployed state when it does not exist."""
        try:
            data = self.current_path.read_bytes()
        except FileNotFoundError:
            return {
                "pointer": self.name,
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
        problem = current_problem(doc, self.name)
        if problem is not None:
            raise DeploymentStateError(f"{self.current_path}: {problem}; {REPAIR_CURRENT}")
        return doc

    def read_history(self, warn: bool = True) -> History:
        """Every event, oldest first. An incomplete last line (a crash cut an append short) is
        no record: it is left out (with a warning naming it when `warn`); any other line that
        is not a valid event raises DeploymentStateError naming its line."""
        try:
            data = self.history_path.read_bytes()
        except FileNotFoundError:
            return History([], 0, b"", 0)
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
            problem = event_problem(event, self.name)
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
        return History(events, complete_bytes, torn, torn_line)

    def snapshot(self) -> tuple[History, dict[str, Any], list[int]]:
        """(history, current, unapplied sequences), read consistently.

        History is read before current.json, the reverse of a change's order, so a line read
        here whose change is missing from the current.json read after it crashed, or is being
        applied right now: then wait for the change's lock and read both again."""
        history, current = self.read_history(warn=True), self.current()
        unapplied = unapplied_sequences(history.events, current)
        if unapplied and unapplied[-1] == history.events[-1]["sequence"] and self.lock_path.exists():
            with self.locked(fcntl.LOCK_SH):
                history, current = self.read_history(warn=False), self.current()
                unapplied = unapplied_sequences(history.events, current)
        return history, current, unapplied

    def applied(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """(current, the history without lines whose change never reached current.json), read
        together: a bundle that never served is never reported as deployed."""
        history, current, unapplied = self.snapshot()
        skipped = set(unapplied)
        return current, [event for event in history.events if event["sequence"] not in skipped]

    # ---- changing ---------------------------------------------------------------------------
    @contextmanager
    def locked(self, mode: int = fcntl.LOCK_EX) -> Iterator[None]:
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

    def commit(
        self,
        history: History,
        action: str,
        current: dict[str, Any],
        target: str | None,
        target_path: str | None,
        stack: list[str],
        fields: dict[str, Any],
    ) -> dict[str, Any]:
        """Record and apply one change; the caller holds the exclusive lock and read both
        files under it. `fields` are the event's actor, reason, figures and dagster_run_id."""
        if action not in ACTIONS:
            raise ValueError(f"action {action!r} is not one of {ACTIONS}")
        if history.torn:
            self._set_torn_tail_aside(history)
        # After a crash between the two writes the history is ahead of current.json: its
        # dangling line keeps its sequence number, which is never used again.
        last = history.events[-1]["sequence"] if history.events else 0
        sequence = max(current["sequence"], last) + 1
        now = dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")
        event = {
            "sequence": sequence,
            "time": now,
            "pointer": self.name,
            "action": action,
            "from": current["bundle_id"],
            "to": target,
            **fields,
        }
        state = {
            "pointer": self.name,
            "bundle_id": target,
            "bundle_path": target_path,
            "sequence": sequence,
            "updated_at": now,
            "stack": stack,
        }
        # History first, then current.json. Had current.json been replaced first, a crash
        # before the append would leave a bundle serving that no history line accounts for
        # (who, why, from what). This order makes every change of current.json have its line;
        # the worst a crash leaves is a line (sequence above current.json's) whose change was
        # never applied: current.json stays the truth and readers report the line as unapplied.
        self._append_history(canonical_json(event) + b"\n")
        crash_point("deploy.history_appended")
        atomic_write_bytes(self.current_path, canonical_json(state))
        return event

    def _set_torn_tail_aside(self, history: History) -> None:
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

"""Named moments where a test can kill this process, or hold it, to prove crash safety.

Writers call `crash_point("artifact.staged:clean_documents")` at the moments a crash would
hurt most (files half written, a directory renamed but its ref not yet replaced, a history
line appended but the pointer not yet switched). Two environment variables, read once at
import, arm them:

- `AIENG_CRASH_AT=NAME` (or `NAME@N`: the N-th time this process reaches NAME) makes the
  process SIGKILL itself there: no `finally`, no `atexit`, no flush, as the OOM killer or a
  power cut would stop it.
- `AIENG_PAUSE_AT=NAME` (or `NAME@N`) with `AIENG_PAUSE_FILE=PATH` holds the process there:
  it creates `PATH.<pid>.waiting`, then waits until PATH exists (a barrier that makes two
  racing writers overlap for certain). It gives up with an error after PAUSE_TIMEOUT_S.

Unarmed (always, outside tests) a call costs one dict lookup.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping
from pathlib import Path

CRASH_ENV = "AIENG_CRASH_AT"
PAUSE_ENV = "AIENG_PAUSE_AT"
PAUSE_FILE_ENV = "AIENG_PAUSE_FILE"
PAUSE_TIMEOUT_S = 300.0
PAUSE_POLL_S = 0.01


def parse_point(value: str) -> tuple[str, int]:
    """`NAME` or `NAME@N` -> (NAME, N), N >= 1 (1 when not given)."""
    name, _, nth = value.partition("@")
    if not name or (nth and (not nth.isdigit() or int(nth) < 1)):
        raise ValueError(f"bad fault point {value!r}: expected NAME or NAME@N with N >= 1")
    return name, int(nth) if nth else 1


def armed_points(environ: Mapping[str, str]) -> dict[str, tuple[str, int]]:
    """point name -> (action, hit number) for the points `environ` arms."""
    armed = {}
    for env, action in ((CRASH_ENV, "crash"), (PAUSE_ENV, "pause")):
        if environ.get(env):
            name, nth = parse_point(environ[env])
            armed[name] = (action, nth)
    return armed


_ARMED = armed_points(os.environ)
_hits: dict[str, int] = {}


def crash_point(name: str) -> None:
    """Crash or hold here if the environment armed `name`; otherwise do nothing."""
    armed = _ARMED.get(name)
    if armed is None:
        return
    action, nth = armed
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] != nth:
        return
    if action == "crash":
        os.kill(os.getpid(), signal.SIGKILL)
    else:
        _pause(name)


def _pause(name: str) -> None:
    release = os.environ.get(PAUSE_FILE_ENV)
    if not release:
        raise RuntimeError(f"{PAUSE_ENV}={name} needs {PAUSE_FILE_ENV}, the file whose appearance releases it")
    Path(f"{release}.{os.getpid()}.waiting").touch()
    deadline = time.monotonic() + PAUSE_TIMEOUT_S
    while not os.path.exists(release):
        if time.monotonic() > deadline:
            raise RuntimeError(f"held at {name} for {PAUSE_TIMEOUT_S:.0f} s and {release} never appeared")
        time.sleep(PAUSE_POLL_S)

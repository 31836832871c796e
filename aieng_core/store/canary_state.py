"""A canary rollout's state beside its pointer: `deployments/<pointer>/canary.json`.

`{bundle_id, share, step, steps, started_at, updated_at, actor, pointer_sequence, production}`
while a rollout runs (gate/canary.py writes it, atomically; absent when none runs). A server
following the pointer (`aieng serve --deployment current`) loads the candidate beside what it
serves and sends it `share` of the generation requests, chosen by a hash of each request id
(routes_to_canary): the same id always lands on the same side, on every server. Here, below
both the rollout and the servers, so that both read the one format.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from pathlib import Path
from typing import Any

from aieng_core.store.atomic import atomic_write_bytes
from aieng_core.store.pointers import PRODUCTION, DeploymentError, deployments_dir

CANARY_FILE = "canary.json"
# The rollout rewrites the file (its `updated_at`) every second; a server ignores a file older
# than this: the rollout's process is gone (killed, its host lost) and nothing would ever end it.
CANARY_STALE_S = 30.0


def canary_path(home: Path | str, pointer: str = PRODUCTION) -> Path:
    return deployments_dir(home) / pointer / CANARY_FILE


def routes_to_canary(request_id: str, share: float) -> bool:
    """Whether a request with this id goes to the candidate when it takes `share` (0..1) of
    the traffic: the first 8 bytes of SHA-256 of the id, as a fraction of 2**64, below
    `share`. The same id always goes the same way, and a larger share keeps every id a
    smaller one sent to the candidate."""
    if share <= 0.0:
        return False
    if share >= 1.0:
        return True
    digest = hashlib.sha256(request_id.encode("utf-8", errors="surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") < share * 2**64


# ---- state ------------------------------------------------------------------------------------
def read_canary(home: Path | str, pointer: str = PRODUCTION) -> dict[str, Any] | None:
    """The rollout running on `pointer`, or None. A damaged file raises DeploymentError naming it."""
    path = canary_path(home, pointer)
    try:
        state = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise DeploymentError(f"{path}: unreadable canary state: {exc}") from None
    problem = _state_problem(state)
    if problem is not None:
        raise DeploymentError(f"{path}: {problem}")
    return dict(state)


def _state_problem(state: Any) -> str | None:
    if not isinstance(state, dict):
        return "not a JSON object"
    if not isinstance(state.get("bundle_id"), str) or not state["bundle_id"]:
        return "bundle_id must be a bundle id"
    share = state.get("share")
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0.0 <= share <= 1.0:
        return f"share must be a number in [0, 1], not {share!r}"
    return None


def write_canary(home: Path | str, pointer: str, state: dict[str, Any]) -> None:
    problem = _state_problem(state)
    if problem is not None:
        raise DeploymentError(f"canary state: {problem}")
    path = canary_path(home, pointer)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, json.dumps(state, indent=2, sort_keys=True).encode() + b"\n")


def clear_canary(home: Path | str, pointer: str = PRODUCTION) -> None:
    canary_path(home, pointer).unlink(missing_ok=True)


def live_canary(home: Path | str, pointer: str, sequence: int, now: float) -> dict[str, Any] | None:
    """The canary a server should route to: the rollout's state, if one runs, was started on
    the pointer as it is now (`pointer_sequence`: a promote or rollback by hand since ends
    it for the servers at once), and its process beat within CANARY_STALE_S; else None."""
    state = read_canary(home, pointer)
    if state is None or state.get("pointer_sequence") != sequence:
        return None
    try:
        beat = dt.datetime.fromisoformat(str(state.get("updated_at"))).timestamp()
    except ValueError:
        return None
    return state if now - beat <= CANARY_STALE_S else None

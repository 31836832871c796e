"""What a deployment pointer names now, for `aieng serve --deployment current` to follow.

The pointer file is replaced atomically by every promote and rollback (deployments.py), so
reading it needs no lock: a reader sees the old pointer or the new one, never a mix. The
bundle's directory comes from the artifact store by id, not from the path written in the
pointer, so a home that moved (or is mounted elsewhere on a replica) still resolves.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from aieng_core.bundle.serving_bundle import KIND as BUNDLE_KIND
from aieng_core.deploy.deployments import Deployments
from aieng_core.store import ArtifactStore


@dataclass(frozen=True)
class PointerTarget:
    pointer: str
    bundle_id: str | None  # None: nothing is deployed (never promoted, or rolled back to no bundle)
    path: Path | None
    sequence: int


def read_target(home: Path, pointer: str = "production") -> PointerTarget:
    """The bundle the pointer names now. Raises (naming the file or the id) when the pointer
    is unreadable or names a bundle the store does not hold."""
    current = Deployments(home, pointer).current()
    bundle_id = current.get("bundle_id")
    sequence = int(current.get("sequence", 0))
    if bundle_id is None:
        return PointerTarget(pointer, None, None, sequence)
    path = ArtifactStore(home).get(BUNDLE_KIND, bundle_id).path
    return PointerTarget(pointer, bundle_id, path, sequence)

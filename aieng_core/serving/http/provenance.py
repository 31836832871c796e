"""What produced an answer: the bundle id and the data version every response names.

Every response of the server carries, next to X-Request-ID:

- `X-Aieng-Bundle-Id`: the bundle that answered. A generation request is answered by the
  replica it took when it arrived, which during a swap may no longer be the one served now;
  any other response (health, /version, /metrics, /v1/models, a 4xx before a replica was
  taken, a 404) names the bundle served now.
- `X-Aieng-Data-Version`: that bundle's data version, the content hash of the
  dataset_manifest its lineage names (store/lineage.py `bundle_data_version`).

With no bundle served (a pointer that names none, still loading, failed) both say `none`;
a bundle outside an artifact store (or whose dataset_manifest its store no longer holds)
has the data version `unknown`. A streamed completion also names both in its last data
event before `data: [DONE]`, as `"aieng": {"bundle_id", "data_version"}`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aieng_core.store.request_log import NO_BUNDLE

if TYPE_CHECKING:
    from aieng_core.serving.http.replica import Replica
    from aieng_core.serving.http.state import ServingState

BUNDLE_HEADER = "X-Aieng-Bundle-Id"
DATA_VERSION_HEADER = "X-Aieng-Data-Version"
REQUEST_ID_HEADER = "X-Request-ID"
# The key of a streamed completion's last chunk that names the bundle and the data version.
STREAM_KEY = "aieng"

Provenance = tuple[str, str]  # (bundle id, data version)
NOTHING_SERVED: Provenance = (NO_BUNDLE, NO_BUNDLE)


def of_replica(replica: Replica | None) -> Provenance:
    if replica is None:
        return NOTHING_SERVED
    return replica.bundle_id, replica.data_version


def served_now(state: ServingState) -> Provenance:
    """The bundle served now (what a response that took no replica names)."""
    return of_replica(state.current)


def headers(provenance: Provenance) -> list[tuple[bytes, bytes]]:
    bundle_id, data_version = provenance
    return [
        (BUNDLE_HEADER.lower().encode("latin-1"), bundle_id.encode("latin-1")),
        (DATA_VERSION_HEADER.lower().encode("latin-1"), data_version.encode("latin-1")),
    ]


def stream_field(provenance: Provenance) -> dict[str, dict[str, str]]:
    bundle_id, data_version = provenance
    return {STREAM_KEY: {"bundle_id": bundle_id, "data_version": data_version}}

"""An answer names what produced it (serving/http/provenance.py), in this process under a real
uvicorn on loopback with real tiny bundles: a generation request names the replica it ran on
even when a swap installed another before it finished; everything else names the bundle
served now; the request log records what the headers said.

The swap at the worst moment is made certain, not waited for: the state's acquire is wrapped
so the next bundle is installed right after the request took its replica.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from aieng_core import asset_keys
from aieng_core.bundle.serving_bundle import build_serving_bundle
from aieng_core.serving.http.app import create_app
from aieng_core.serving.http.replica import Replica, open_replica
from aieng_core.serving.http.state import ServingState
from aieng_core.store import Artifact, ArtifactStore
from aieng_core.store.request_log import RequestLog
from tests.bundle_fixtures import BundledHome
from tests.core.serving.http_helpers import serving


@pytest.fixture(scope="module")
def other_bundle(serving_bundle_artifact: BundledHome, tmp_path_factory: pytest.TempPathFactory) -> Artifact:
    """The same model bundled with max_batch 8, in a copy of the shared home."""
    home = tmp_path_factory.mktemp("provenance") / "home"
    shutil.copytree(serving_bundle_artifact.home, home)
    config = serving_bundle_artifact.config
    other = config.model_copy(update={"bundle": config.bundle.model_copy(update={"max_batch": 8})})
    bundle = build_serving_bundle(ArtifactStore(home), other)
    assert bundle.id != serving_bundle_artifact.bundle.id
    return bundle


@pytest.fixture(scope="module")
def data_version(serving_bundle_artifact: BundledHome) -> str:
    """The dataset_manifest's content hash, found as an operator would: the current one."""
    version = serving_bundle_artifact.store.require_current(asset_keys.DATASET_MANIFEST).content_sha256
    assert len(version) == 64
    return version


def named(reply: Any) -> tuple[str, str]:
    return reply.headers["x-aieng-bundle-id"], reply.headers["x-aieng-data-version"]


def swap_after_acquiring(state: ServingState, monkeypatch: pytest.MonkeyPatch, replica: Replica) -> None:
    """The next acquire() takes the replica served now, then `replica` is installed: a reload
    that completed just after the request came in."""
    acquire = state.acquire

    def swapped(request_id: str | None = None) -> Replica:
        monkeypatch.setattr(state, "acquire", acquire)
        taken = acquire(request_id)
        state._install(replica)
        return taken

    monkeypatch.setattr(state, "acquire", swapped)


def sse_events(body: bytes) -> list[str]:
    return [line[len("data: ") :] for line in body.decode().split("\n") if line.startswith("data: ")]


def test_a_request_names_the_replica_it_ran_on_through_a_swap(
    serving_bundle_artifact: BundledHome,
    other_bundle: Artifact,
    data_version: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    first = serving_bundle_artifact.bundle
    config = serving_bundle_artifact.config
    log_path = tmp_path / "logs" / "requests.jsonl"
    app = create_app(first.path, config, admin_token=None, request_log=RequestLog(log_path))
    with serving(app) as server:
        state = server.state
        swap_after_acquiring(state, monkeypatch, open_replica(other_bundle.path, config, state._on_step, state.threads))
        reply = server.post(
            "/generate", {"prompt": "The data", "max_new_tokens": 4, "ignore_eos": True}, {"X-Request-ID": "swapped"}
        )
        assert reply.status == 200, reply.body
        assert named(reply) == (first.id, data_version)  # the replica it ran on ...
        version = server.get("/version")
        assert version.json["bundle_id"] == other_bundle.id  # ... not the one served by then
        assert named(version) == (other_bundle.id, data_version)
        assert version.json["data_version"] == data_version

        # A stream: headers and the last event before [DONE] name the replica it ran on.
        swap_after_acquiring(state, monkeypatch, open_replica(first.path, config, state._on_step, state.threads))
        body = {"prompt": ["a", "b"], "max_tokens": 3, "ignore_eos": True, "stream": True, "temperature": 0}
        stream = server.post("/v1/completions", body, {"X-Request-ID": "streamed"})
        assert stream.status == 200 and named(stream) == (other_bundle.id, data_version)
        events = sse_events(stream.body)
        assert events[-1] == "[DONE]"
        chunks = [json.loads(event) for event in events[:-1]]
        provenance = {"bundle_id": other_bundle.id, "data_version": data_version}
        assert chunks[-1]["aieng"] == provenance and chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert all("aieng" not in chunk for chunk in chunks[:-1])
        assert named(server.get("/health/ready")) == (first.id, data_version)
        bad = server.post("/generate", {"prompt": ""}, {"X-Request-ID": "refused"})
        assert bad.status == 400 and named(bad) == (first.id, data_version)  # no replica taken: served now
    records = [json.loads(line) for line in log_path.read_text(encoding="utf-8").splitlines()]
    # Health probes and metrics scrapes are not logged; every other answer is, once.
    assert [(r["request_id"], r["path"], r["status"], r["bundle_id"]) for r in records] == [
        ("swapped", "/generate", 200, first.id),
        (version.headers["x-request-id"], "/version", 200, other_bundle.id),
        ("streamed", "/v1/completions", 200, other_bundle.id),
        ("refused", "/generate", 400, first.id),
    ]
    assert all(r["data_version"] == data_version and r["latency_ms"] > 0 for r in records)
    assert (records[0]["finish_reason"], records[0]["completion_tokens"]) == ("length", 4)
    assert (records[2]["finish_reason"], records[2]["completion_tokens"]) == ("length", 6)
    assert set(records[1]) == {
        "time",
        "request_id",
        "method",
        "path",
        "status",
        "bundle_id",
        "data_version",
        "latency_ms",
    }


def test_a_bundle_outside_a_store_has_an_unknown_data_version(
    serving_bundle_artifact: BundledHome, copy_bundle, tmp_path: Path
) -> None:
    path = copy_bundle(serving_bundle_artifact.bundle)  # a bundle directory, no store around it
    app = create_app(path, serving_bundle_artifact.config, admin_token=None)
    with serving(app) as server:
        for reply in (server.get("/health/ready"), server.get("/nope"), server.post("/generate", {"prompt": "x"})):
            assert named(reply) == (serving_bundle_artifact.bundle.id, "unknown"), reply.body
        assert server.get("/version").json["data_version"] == "unknown"

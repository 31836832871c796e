"""An answer names what produced it, on a real `aieng serve --deployment current`: every
response carries X-Aieng-Bundle-Id and X-Aieng-Data-Version beside X-Request-ID (errors,
health, metrics, 404s, body-limit refusals and streams included; `none` while nothing is
served), a stream names both in its last event too, and `aieng lineage --request ID` finds a
logged request and prints the bundle that answered it and its chain down to the raw files.

One server for the module, following the production pointer of a copy of the home holding
two bundles. The last test promotes the second bundle: it runs last.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from aieng_core import asset_keys
from aieng_core.hashing import sha256_file
from aieng_core.store import ArtifactStore
from aieng_core.store.request_log import default_request_log
from tests.conftest import TINY_CONFIG
from tests.e2e.serve_helpers import AIENG, REPO_ROOT, Reply, Server, deploy, home_with_both_bundles, poll, start_server

pytestmark = pytest.mark.e2e

MAX_REQUEST_BYTES = 1048576  # configs/tiny.yaml serving.max_request_bytes
PROMPT = {"prompt": "The data pipeline", "max_new_tokens": 3, "temperature": 0}


@dataclass
class Following:
    server: Server
    home: Path
    first_id: str
    second_id: str
    data_version: str
    nothing_served: dict[str, Reply]  # answers while the pointer named no bundle


@pytest.fixture(scope="module")
def following(tmp_path_factory: pytest.TempPathFactory, serving_bundle_artifact, second_bundle) -> Iterator[Following]:
    folder = tmp_path_factory.mktemp("response-lineage")
    home = home_with_both_bundles(second_bundle, folder / "home")
    store = ArtifactStore(home)
    # The data version as an operator finds it: the current dataset_manifest's content hash.
    data_version = store.require_current(asset_keys.DATASET_MANIFEST).content_sha256
    server = start_server(folder / "server", None, home=home, wait_for="/health/live")
    try:

        def nothing_deployed() -> bool:
            ready = server.get("/health/ready")
            return ready.status == 503 and ready.error_code == "no_deployment"

        poll(nothing_deployed, 60, "readiness to say nothing is deployed")
        nothing_served = {
            "ready": server.get("/health/ready"),
            "generate": server.post("/generate", PROMPT),
            "version": server.get("/version"),
            "metrics": server.get("/metrics"),
            "models": server.get("/v1/models"),
        }
        first_id = serving_bundle_artifact.bundle.id
        deploy(home, "promote", first_id, "--reason", "first")
        poll(lambda: server.get("/health/ready").json_or_none() == {**ready_body(first_id)}, 60, "the first bundle")
        yield Following(server, home, first_id, second_bundle.id, data_version, nothing_served)
    finally:
        assert server.stop() == 0, server.log_tail()


def ready_body(bundle_id: str, sequence: int = 1) -> dict[str, Any]:
    deployment = {"pointer": "production", "bundle_id": bundle_id, "sequence": sequence, "refused": False}
    return {"status": "ready", "bundle_id": bundle_id, "deployment": {**deployment, "mismatch": None, "canary": None}}


def named(headers: dict[str, str]) -> tuple[str, str]:
    return headers["x-aieng-bundle-id"], headers["x-aieng-data-version"]


def refused_unread(server: Server, path: str, length: int) -> tuple[int, dict[str, str]]:
    """A POST announcing `length` bytes and sending none: the status and headers answered."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        sock.sendall(f"{head}Content-Length: {length}\r\nExpect: 100-continue\r\n\r\n".encode("latin-1"))
        data = b""
        while b"\r\n\r\n" not in data:
            received = sock.recv(65536)
            assert received, f"the connection closed before a response: {data!r}"
            data += received
    status_line, *lines = data.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    return int(status_line.split()[1]), {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}


ROUTES = [
    ("GET", "/health/live", None, {}, 200),
    ("GET", "/health/ready", None, {}, 200),
    ("GET", "/version", None, {}, 200),
    ("GET", "/metrics", None, {}, 200),
    ("GET", "/v1/models", None, {}, 200),
    ("POST", "/generate", PROMPT, {}, 200),
    ("POST", "/predict", {"inputs": ["a", "b"], "options": {"max_new_tokens": 2}}, {}, 200),
    ("POST", "/v1/completions", {"prompt": "a", "max_tokens": 2}, {}, 200),
    ("POST", "/v1/completions", {"prompt": "a", "max_tokens": 2, "stream": True}, {}, 200),
    ("POST", "/generate", {"prompt": ""}, {}, 400),
    ("POST", "/generate", b"{not json", {}, 400),
    ("POST", "/generate", PROMPT, {"X-Request-ID": "bad id with spaces"}, 400),
    ("POST", "/v1/completions", {"prompt": "a", "model": "someone-else"}, {}, 404),
    ("GET", "/nope", None, {}, 404),
    ("POST", "/admin/reload", {"bundle": "x"}, {}, 404),
    ("GET", "/generate", None, {}, 405),
    ("POST", "/generate", MAX_REQUEST_BYTES + 1, {}, 413),
]


def route_id(route: tuple[str, str, Any, dict[str, str], int]) -> str:
    method, path, body, _headers, status = route
    return f"{method} {path} {status}" + ("-stream" if isinstance(body, dict) and body.get("stream") else "")


@pytest.mark.parametrize(("method", "path", "body", "headers", "status"), ROUTES, ids=[route_id(r) for r in ROUTES])
def test_every_response_names_the_bundle_and_the_data_version(
    following: Following, method: str, path: str, body: Any, headers: dict[str, str], status: int
) -> None:
    server = following.server
    if isinstance(body, int):  # a body over the limit, announced and never sent
        answered, reply_headers = refused_unread(server, path, body)
    else:
        reply = server.call(method, path, body, headers)
        answered, reply_headers = reply.status, reply.headers
    assert answered == status
    assert named(reply_headers) == (following.first_id, following.data_version)
    assert reply_headers["x-request-id"]


def test_with_nothing_served_every_response_says_none(following: Following) -> None:
    answers = following.nothing_served
    assert {name: reply.status for name, reply in answers.items()} == {
        "ready": 503,
        "generate": 503,
        "version": 503,
        "metrics": 200,
        "models": 200,
    }
    for reply in answers.values():
        assert named(reply.headers) == ("none", "none")


def test_a_stream_names_them_in_its_last_event_and_the_openai_client_reads_it(following: Following) -> None:
    server = following.server
    provenance = {"bundle_id": following.first_id, "data_version": following.data_version}
    for include_usage in (False, True):
        body = {"prompt": ["a", "b"], "max_tokens": 3, "temperature": 0, "stream": True, "ignore_eos": True}
        if include_usage:
            body["stream_options"] = {"include_usage": True}
        reply = server.post("/v1/completions", body)
        events = [line[6:] for line in reply.body.decode().split("\n") if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(event) for event in events[:-1]]
        assert chunks[-1]["aieng"] == provenance
        assert ("usage" in chunks[-1] and chunks[-1]["choices"] == []) is include_usage
        assert sum("aieng" in chunk for chunk in chunks) == 1

    client = server.client()
    kwargs = {"model": "aieng", "prompt": "The data pipeline", "max_tokens": 6, "temperature": 0}
    whole = client.completions.create(**kwargs).choices[0].text
    streamed = list(client.completions.create(**kwargs, stream=True))
    assert "".join(c.choices[0].text for c in streamed if c.choices) == whole
    assert (streamed[-1].model_extra or {})["aieng"] == provenance
    raw = client.completions.with_raw_response.create(**kwargs)
    assert named({k.lower(): v for k, v in raw.headers.items()}) == (following.first_id, following.data_version)


def lineage_cli(home: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIENG_")}
    env.update(AIENG_HOME=str(home), AIENG_CONFIG=str(TINY_CONFIG))
    return subprocess.run(
        [AIENG, "lineage", *arguments], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def logged(following: Following, request_id: str) -> dict[str, Any]:
    """The request log's record of `request_id`, once the server has written it."""
    log = default_request_log(following.home)

    def found() -> list[dict[str, Any]]:
        if not log.exists():
            return []
        records = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
        return [r for r in records if r["request_id"] == request_id]

    (record,) = poll(found, 10, f"the request log's record of {request_id}")
    return record


def test_lineage_request_names_the_bundle_that_answered_down_to_the_raw_files(following: Following) -> None:
    server, home = following.server, following.home
    reply = server.post("/v1/completions", {"prompt": "The data", "max_tokens": 4, "ignore_eos": True})
    assert reply.status == 200
    request_id = reply.headers["x-request-id"]
    record = logged(following, request_id)
    assert record == {
        "time": record["time"],
        "request_id": request_id,
        "method": "POST",
        "path": "/v1/completions",
        "status": 200,
        "bundle_id": following.first_id,
        "data_version": following.data_version,
        "latency_ms": record["latency_ms"],
        "finish_reason": "length",
        "prompt_tokens": record["prompt_tokens"],
        "completion_tokens": 4,
    }

    started = time.perf_counter()
    done = lineage_cli(home, "--request", request_id, "--json")
    print(f"aieng lineage --request (a process, interpreter start-up included): {time.perf_counter() - started:.2f} s")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["root"] == reply.headers["x-aieng-bundle-id"] == following.first_id
    assert result["request"] == record and result["chain_data_version"] == following.data_version
    raw = [node for node in result["nodes"].values() if node["kind"] == asset_keys.RAW_DOCUMENTS]
    sources = [source for node in raw for source in node["sources"]]
    assert len(raw) == 3 and len(sources) == 5
    for source in sources:  # down to the landed files, whose bytes are those recorded
        assert sha256_file(Path(source["path"])) == source["sha256"]
    text = lineage_cli(home, "--request", request_id)
    assert text.returncode == 0, text.stderr
    assert text.stdout.splitlines()[1] == (
        f"answered by serving_bundle {following.first_id}, data version {following.data_version}"
    )

    # Another bundle serves from now on: a new answer names it, the old one still its own.
    deploy(home, "promote", following.second_id, "--reason", "second")
    poll(lambda: server.get("/health/ready").json_or_none() == ready_body(following.second_id, 2), 60, "the second")
    later = server.post("/generate", PROMPT, {"X-Request-ID": "after-the-promote"})
    assert named(later.headers) == (following.second_id, following.data_version)
    logged(following, "after-the-promote")
    assert json.loads(lineage_cli(home, "--request", "after-the-promote", "--json").stdout)["root"] == (
        following.second_id
    )
    assert json.loads(lineage_cli(home, "--request", request_id, "--json").stdout)["root"] == following.first_id

    missing = lineage_cli(home, "--request", "never-sent")
    assert missing.returncode == 1 and missing.stdout == ""
    assert missing.stderr.startswith("aieng: error: request 'never-sent' is not in the request log ")
    elsewhere = lineage_cli(home, "--request", request_id, "--request-log", str(home / "no-such.jsonl"))
    assert elsewhere.returncode == 1 and f"there is no request log at {home / 'no-such.jsonl'}" in elsewhere.stderr

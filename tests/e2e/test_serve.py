"""`aieng serve` as an operator runs it: a real server process on a free loopback port, the
tiny bundle, and clients that speak HTTP (the project's loopback client, raw sockets, the
official openai client).

Every server is started and stopped by the test that needs it (SIGTERM, then a kill after a
bound); every wait is a poll with a deadline (serve_helpers.py). Long generations are made
long by volume (hundreds of sequences of ignore_eos tokens), never by sleeping.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from aieng_core import asset_keys
from aieng_core.deploy.deployments import Deployments
from aieng_core.serving.http.metrics import METRIC_HELP, POINTER_METRICS
from tests.conftest import TINY_CONFIG
from tests.e2e.serve_helpers import (
    AIENG,
    LONG_INPUTS,
    LONG_TOKENS,
    REPO_ROOT,
    STOP_TIMEOUT_S,
    Reply,
    Server,
    deploy,
    deploy_refused,
    flip_one_byte,
    free_port,
    greedy_answers,
    home_with_both_bundles,
    long_predict,
    poll,
    raw_request,
    serving,
    start_server,
)

pytestmark = pytest.mark.e2e

ADMIN_TOKEN = "test-admin-token-0123456789"
BIG_QUEUE = {"max_waiting": 256}


@pytest.fixture(scope="module")
def goldens(bundle_path: Path) -> list[dict[str, Any]]:
    """The golden prompts (the golden conversations are test_chat_completions.py's)."""
    outputs = json.loads((bundle_path / "golden.json").read_text(encoding="utf-8"))["outputs"]
    return [golden for golden in outputs if "messages" not in golden]


@pytest.fixture(scope="module")
def data_version(serving_bundle_artifact) -> str:
    """The content hash of the dataset_manifest the session bundle was trained on."""
    return serving_bundle_artifact.store.require_current(asset_keys.DATASET_MANIFEST).content_sha256


def names_bundle(reply: Reply, bundle_id: str, data_version: str) -> bool:
    return (reply.headers["x-aieng-bundle-id"], reply.headers["x-aieng-data-version"]) == (bundle_id, data_version)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, bundle_path: Path) -> Iterator[Server]:
    """One server for the tests that leave it as they found it (admin API disabled)."""
    with serving(tmp_path_factory.mktemp("serve"), bundle_path, **BIG_QUEUE) as running:
        yield running


# ---- endpoints -------------------------------------------------------------------------------------


def test_health_version_and_models(server: Server, serving_bundle_artifact) -> None:
    bundle = serving_bundle_artifact.bundle
    assert server.get("/health/live").json == {"status": "live"}
    assert server.get("/health/ready").json == {"status": "ready", "bundle_id": bundle.id}
    version = server.get("/version").json
    assert version["bundle_id"] == bundle.id
    assert version["code_version"] == bundle.manifest["code_version"]
    assert version["created_at"] == bundle.manifest["created_at"]
    assert version["lineage"]["model_checkpoint"] == serving_bundle_artifact.model.id
    assert version["inputs"] == [
        {"kind": "model_checkpoint", "id": serving_bundle_artifact.model.id},
        {"kind": "benchmark_report", "id": bundle.metrics["benchmark_report_id"]},
    ]
    models = server.get("/v1/models").json
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == [bundle.id]
    assert [m.id for m in server.client().models.list().data] == [bundle.id]


def test_generate_greedy_equals_goldens(server: Server, goldens: list[dict[str, Any]]) -> None:
    def generate(golden: dict[str, Any]) -> dict[str, Any]:
        body = {"prompt": golden["prompt"], "max_new_tokens": golden["max_new_tokens"], "temperature": 0}
        reply = server.post("/generate", body)
        assert reply.status == 200, reply.body
        return reply.json

    one_at_a_time = [generate(golden) for golden in goldens]
    with ThreadPoolExecutor(16) as pool:  # batched with each other: batching never changes a result
        together = list(pool.map(generate, goldens * 4))
    for golden, result in zip(goldens * 5, one_at_a_time + together):
        assert result["token_ids"] == golden["token_ids"], golden["prompt"]
        assert result["text"] == golden["text"]
        assert result["tokens"] == len(golden["token_ids"])
        assert result["finish_reason"] == golden["finish_reason"]
        assert result["prompt_tokens"] == len(golden["prompt_ids"])
        assert result["latency_ms"] > 0


def test_predict_returns_every_output_in_order(server: Server, goldens: list[dict[str, Any]]) -> None:
    body = {
        "request_id": "predict-1",
        "inputs": [g["prompt"] for g in goldens],
        "options": {"max_new_tokens": goldens[0]["max_new_tokens"], "temperature": 0},
    }
    reply = server.post("/predict", body)
    assert reply.status == 200, reply.body
    assert reply.json["request_id"] == "predict-1"
    assert reply.headers["x-request-id"] == "predict-1"
    assert [o["text"] for o in reply.json["outputs"]] == [g["text"] for g in goldens]
    assert [o["tokens"] for o in reply.json["outputs"]] == [len(g["token_ids"]) for g in goldens]


def test_openai_client_streamed_equals_non_streamed(server: Server, goldens: list[dict[str, Any]]) -> None:
    client = server.client()
    for golden in goldens:
        kwargs = {"model": "aieng", "prompt": golden["prompt"], "max_tokens": 24, "temperature": 0}
        completion = client.completions.create(**kwargs)
        assert completion.object == "text_completion"
        (choice,) = completion.choices
        assert choice.finish_reason in ("stop", "length")
        assert choice.text.startswith(golden["text"]) or golden["text"].startswith(choice.text)
        assert completion.usage.prompt_tokens == len(golden["prompt_ids"])
        assert completion.usage.total_tokens == completion.usage.prompt_tokens + completion.usage.completion_tokens

        chunks = list(client.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        assert text == choice.text
        reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
        assert reasons[-1] == choice.finish_reason and set(reasons[:-1]) <= {None}
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == completion.usage.completion_tokens


def test_openai_client_model_names_and_seeds(server: Server, serving_bundle_artifact) -> None:
    client = server.client()
    bundle_id = serving_bundle_artifact.bundle.id
    by_id = client.completions.create(model=bundle_id, prompt="Once", max_tokens=5, temperature=0)
    assert by_id.model == bundle_id
    with pytest.raises(openai.NotFoundError) as raised:
        client.completions.create(model="gpt-4", prompt="Once", max_tokens=5)
    assert raised.value.body["param"] == "model"
    # A seed makes sampled output reproducible; a list of prompts gets one choice each.
    sampled = [
        client.completions.create(model="aieng", prompt=["A model", "数据"], max_tokens=12, temperature=1.0, seed=7)
        for _ in range(2)
    ]
    assert [c.text for c in sampled[0].choices] == [c.text for c in sampled[1].choices]
    assert [c.index for c in sampled[0].choices] == [0, 1]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"prompt": "a", "foo": 1}, "foo"),
        ("/v1/completions", {"prompt": "a", "logprobs": 21}, "logprobs"),
        ("/v1/completions", {"prompt": "a", "n": 0}, "n"),
        ("/v1/completions", {"prompt": "a", "best_of": 3}, "best_of"),
        ("/v1/completions", {"prompt": "a", "presence_penalty": 2.5}, "presence_penalty"),
        ("/v1/completions", {"prompt": "a", "frequency_penalty": -3}, "frequency_penalty"),
        ("/v1/completions", {"prompt": "a", "logit_bias": {"7": 101}}, "logit_bias"),
        ("/v1/completions", {"prompt": "a", "logit_bias": {"99999": 1}}, "logit_bias"),
        ("/v1/completions", {"prompt": "a", "suffix": "b"}, "suffix"),
        ("/v1/completions", {"prompt": "The data pipeline", "max_tokens": 64}, "max_tokens"),
        ("/v1/completions", {"prompt": "a", "temperature": 3}, "temperature"),
        ("/v1/completions", {"max_tokens": 3}, "prompt"),
        ("/generate", {"prompt": "The data pipeline", "max_new_tokens": 60}, "max_new_tokens"),
        ("/generate", {"prompt": "a", "top_p": 0}, "top_p"),
        ("/generate", {"prompt": "a", "temperature": -1}, "temperature"),
        ("/generate", {"prompt": ""}, "prompt"),
        ("/generate", {"prompt": "a", "stop": [""]}, "stop"),
        ("/generate", {"prompt": "a", "max_tokens": 4}, "max_tokens"),
        ("/generate", {"prompt": "a", "request_id": "no spaces please"}, "request_id"),
        ("/predict", {"inputs": []}, "inputs"),
        ("/predict", {"inputs": ["a"], "options": {"bogus": 1}}, "options"),
        ("/predict", {"inputs": ["The data pipeline"], "options": {"max_new_tokens": 60}}, "options.max_new_tokens"),
    ],
)
def test_bad_requests_are_400_naming_the_field(server: Server, path: str, body: dict, param: str) -> None:
    reply = server.post(path, body)
    assert reply.status == 400, reply.body
    error = reply.error
    assert error["param"] == param
    assert param.split(".")[-1] in error["message"]
    assert error["type"] == "invalid_request_error"
    assert "Traceback" not in reply.body.decode()


def test_malformed_requests(server: Server) -> None:
    not_json = server.post("/generate", b"{not json")
    assert not_json.status == 400 and "error" in not_json.json
    bad_id = server.post("/generate", {"prompt": "a"}, headers={"X-Request-ID": "bad id with spaces"})
    assert bad_id.status == 400 and bad_id.error["param"] == "X-Request-ID"
    missing = server.get("/nope")
    assert missing.status == 404 and missing.error["type"] == "not_found_error"
    wrong_method = server.get("/generate")
    assert wrong_method.status == 405 and "error" in wrong_method.json


def test_request_id_is_echoed_and_logged(server: Server) -> None:
    given = server.post("/generate", {"prompt": "a", "max_new_tokens": 2}, headers={"X-Request-ID": "rid-given-42"})
    assert given.status == 200
    assert given.headers["x-request-id"] == "rid-given-42" and given.json["request_id"] == "rid-given-42"
    in_body = server.post("/generate", {"prompt": "a", "max_new_tokens": 2, "request_id": "rid-body-7"})
    assert in_body.headers["x-request-id"] == "rid-body-7" and in_body.json["request_id"] == "rid-body-7"
    generated = server.post("/generate", {"prompt": "a", "max_new_tokens": 2})
    assert len(generated.headers["x-request-id"]) == 32
    assert generated.json["request_id"] == generated.headers["x-request-id"]
    error = server.post("/generate", {"prompt": "a", "n": 2}, headers={"X-Request-ID": "rid-error-1"})
    assert error.status == 400 and error.headers["x-request-id"] == "rid-error-1"

    def logged() -> list[dict[str, Any]]:
        return [line for line in server.log_lines() if line.get("request_id") == "rid-given-42"]

    (line,) = poll(logged, 10, "the request's log line")
    assert line["path"] == "/generate" and line["status"] == 200
    assert line["completion_tokens"] == 2 and line["prompt_tokens"] >= 1 and line["latency_ms"] > 0
    assert line["batch_size"] >= 1
    assert {"timestamp", "level", "logger", "message"} <= set(line)
    assert poll(lambda: [ln for ln in server.log_lines() if ln.get("request_id") == "rid-body-7"], 10, "body id")


def test_metrics_expose_every_name(server: Server) -> None:
    assert server.post("/generate", {"prompt": "a", "max_new_tokens": 3}).status == 200
    text = server.get("/metrics").body.decode()
    names = {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}
    for name in METRIC_HELP:
        if name in POINTER_METRICS:  # only a server following a pointer exports those
            assert name not in names, name
        else:
            assert name in names or f"{name}_count" in names, name
    assert "process_resident_memory_bytes" in names
    assert not [name for name in names if ":" in name]
    assert server.metric("aieng_kv_cache_slots") == 16
    assert server.metric("aieng_kv_cache_bytes") > 0
    assert server.metric("aieng_process_resident_memory_bytes") > 0
    assert server.metric("aieng_http_requests_total", endpoint="/generate", status="200") >= 1
    assert server.metric("aieng_request_success_total", finished_reason="length") >= 1
    assert server.metric("aieng_time_to_first_token_seconds_count") >= 1
    assert server.metric("aieng_batch_size_count") >= 1


def test_admin_api_is_disabled_without_a_token(server: Server, bundle_path: Path) -> None:
    reply = server.post(
        "/admin/reload", {"bundle": str(bundle_path)}, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
    )
    assert reply.status == 404 and reply.error["code"] == "disabled"


# ---- disconnects free their slots ----------------------------------------------------------------------


# Several clients at once, each with a share of the long work: the first one's sequences run
# (and, streaming, its events flow) while the others' wait for a slot, so a disconnect is seen
# both mid-generation and before a request's first token.
DISCONNECTING_CLIENTS = 4
REASONS = ("cancelled", "length")  # how a long sequence (ignore_eos, LONG_TOKENS) can end
FREE_WITHIN_S = 1.0  # the issue: free slots are back at the maximum within a second of the disconnect


def finished_counts(server: Server) -> dict[str, float]:
    return {reason: server.metric("aieng_request_success_total", finished_reason=reason) for reason in REASONS}


def assert_the_queue_was_cancelled(server: Server, before: dict[str, float], queued: float) -> None:
    """Every long sequence is counted once, as finished or cancelled, and every one still queued
    when the clients left was cancelled, not run: a queued sequence needs LONG_TOKENS steps
    after admission, far longer than closing the sockets takes. (How many finished before the
    close depends on how fast the machine is; the queue at the close does not.)"""
    after = finished_counts(server)
    cancelled, finished = after["cancelled"] - before["cancelled"], after["length"] - before["length"]
    assert cancelled + finished == LONG_INPUTS
    assert cancelled >= queued > 0


def busy_with_a_queue(server: Server) -> bool:
    m = server.metrics()
    return m[("aieng_num_requests_running", ())] == 16 and m[("aieng_num_requests_waiting", ())] > 0


def seconds_until_idle_after_closing(server: Server, socks: list[socket.socket]) -> float:
    """Close every client's connection at once; seconds from then until /metrics shows every
    KV slot free and nothing running or waiting (polled every POLL_S)."""
    for sock in socks:
        sock.close()
    gone = time.monotonic()
    server.wait_idle(timeout=30)
    return time.monotonic() - gone


def test_streaming_clients_disconnecting_free_their_slots_within_a_second(server: Server) -> None:
    before = finished_counts(server)
    share = LONG_INPUTS // DISCONNECTING_CLIENTS
    socks = []
    for client in range(DISCONNECTING_CLIENTS):
        body = {
            "prompt": [f"stream {client} {n}" for n in range(share)],
            "max_tokens": LONG_TOKENS,
            "ignore_eos": True,
            "temperature": 0,
            "stream": True,
        }
        socks.append(raw_request(server.port, "/v1/completions", body))
    received = b""
    while b"data: {" not in received:  # the first client's stream is flowing
        chunk = socks[0].recv(65536)
        assert chunk, "the server closed the stream before the first event"
        received += chunk
    assert received.startswith(b"HTTP/1.1 200")
    poll(lambda: busy_with_a_queue(server), 10, "every slot busy and a queue")
    queued = server.metric("aieng_num_requests_waiting")
    seconds = seconds_until_idle_after_closing(server, socks)
    print(f"{DISCONNECTING_CLIENTS} streaming clients gone: every KV slot free after {seconds:.3f} s")
    assert seconds <= FREE_WITHIN_S
    assert_the_queue_was_cancelled(server, before, queued)


def test_non_streaming_clients_disconnecting_free_their_slots_within_a_second(server: Server) -> None:
    before = finished_counts(server)
    share = LONG_INPUTS // DISCONNECTING_CLIENTS
    socks = []
    for client in range(DISCONNECTING_CLIENTS):
        body = {
            "inputs": [f"gone {client} {n}" for n in range(share)],
            "options": {"max_new_tokens": LONG_TOKENS, "ignore_eos": True},
        }
        socks.append(raw_request(server.port, "/predict", body))
    poll(lambda: busy_with_a_queue(server), 10, "every slot busy and a queue")
    queued = server.metric("aieng_num_requests_waiting")
    seconds = seconds_until_idle_after_closing(server, socks)
    print(f"{DISCONNECTING_CLIENTS} non-streaming clients gone: every KV slot free after {seconds:.3f} s")
    assert seconds <= FREE_WITHIN_S
    assert_the_queue_was_cancelled(server, before, queued)
    assert server.post("/generate", {"prompt": "still serving", "max_new_tokens": 2}).status == 200


# ---- backpressure, deadlines, drain, reload (each on a server of its own) ---------------------------------


def test_full_queue_is_429_with_retry_after(tmp_path: Path, bundle_path: Path, data_version: str) -> None:
    server = start_server(tmp_path, bundle_path, max_waiting=1)
    try:
        body = {"prompt": "overload", "max_new_tokens": LONG_TOKENS, "ignore_eos": True}
        every: list[Reply] = []
        for _ in range(5):  # bursts of 48 against 16 slots + 1 waiting place; one is plenty, five is the bound
            barrier = threading.Barrier(48)

            def send(_: int, barrier: threading.Barrier = barrier) -> Reply:
                barrier.wait()
                return server.post("/generate", body)

            with ThreadPoolExecutor(48) as pool:
                replies = list(pool.map(send, range(48)))
            every += replies
            if any(r.status == 429 for r in replies):
                break
        assert {r.status for r in every} == {200, 429}
        refused = next(r for r in every if r.status == 429)
        assert int(refused.headers["retry-after"]) >= 1
        assert refused.error["type"] == "overloaded"
        assert all(names_bundle(r, bundle_path.name, data_version) for r in every)
        assert all(r.json["tokens"] == LONG_TOKENS for r in every if r.status == 200)
        rejected = sum(r.status == 429 for r in every)
        assert server.metric("aieng_requests_rejected_total", reason="overloaded") == rejected
        server.wait_idle()
    finally:
        assert server.stop() == 0, server.log_tail()


def test_deadline_is_504_and_frees_slots(tmp_path: Path, bundle_path: Path, data_version: str) -> None:
    server = start_server(tmp_path, bundle_path, request_timeout_s=0.05, **BIG_QUEUE)
    try:
        reply = long_predict(server, "deadline")
        assert reply.status == 504, reply.body
        assert reply.error["type"] == "timeout" and "request_timeout_s" in reply.error["message"]
        assert reply.headers["x-request-id"] == "long-deadline"
        assert names_bundle(reply, bundle_path.name, data_version)
        server.wait_idle()
        assert server.metric("aieng_requests_rejected_total", reason="timeout") == 1
        assert server.metric("aieng_request_success_total", finished_reason="cancelled") > LONG_INPUTS / 2
    finally:
        assert server.stop() == 0, server.log_tail()


def test_sigterm_drains_in_flight_requests_then_exits_0(tmp_path: Path, bundle_path: Path, data_version: str) -> None:
    server = start_server(tmp_path, bundle_path, **BIG_QUEUE)
    try:
        with ThreadPoolExecutor(1) as pool:
            in_flight = pool.submit(long_predict, server, "drain")
            server.wait_running()
            server.proc.send_signal(signal.SIGTERM)
            readiness = poll(lambda: (r := server.get("/health/ready")).status == 503 and r, 10, "readiness 503")
            assert readiness.error["code"] == "draining"
            refused = server.post("/generate", {"prompt": "too late", "max_new_tokens": 2})
            assert refused.status == 503 and refused.error["code"] == "draining"
            assert names_bundle(refused, bundle_path.name, data_version)
            assert names_bundle(readiness, bundle_path.name, data_version)
            assert server.get("/health/live").status == 200
            reply = in_flight.result(timeout=120)
        assert reply.status == 200, reply.body
        assert [o["tokens"] for o in reply.json["outputs"]] == [LONG_TOKENS] * LONG_INPUTS
        assert server.proc.wait(STOP_TIMEOUT_S) == 0
        messages = [line["message"] for line in server.log_lines()]
        assert any(m.startswith("SIGTERM received: draining") for m in messages)
        assert "drained: no request in flight; shutting down" in messages
    finally:
        server.stop()


def test_sigterm_with_a_shutdown_delay_serves_until_it_passes_then_refuses(
    tmp_path: Path, bundle_path: Path, data_version: str
) -> None:
    """serving.shutdown_delay_s: readiness is 503 from the SIGTERM on (a load balancer stops
    routing there), new requests are still answered until the delay has passed, refused as
    draining after it, and the server does not exit before it."""
    delay_s = 5.0
    server = start_server(tmp_path, bundle_path, shutdown_delay_s=delay_s, **BIG_QUEUE)
    try:
        sigterm_at = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        readiness = poll(lambda: (r := server.get("/health/ready")).status == 503 and r, 10, "readiness 503")
        assert readiness.error["code"] == "draining" and names_bundle(readiness, bundle_path.name, data_version)
        assert server.metric("aieng_ready") == 0
        served = server.post("/generate", {"prompt": "still served", "max_new_tokens": 2})
        served_at = time.monotonic()
        assert served_at - sigterm_at < delay_s, "the machine was too slow to send a request inside the delay"
        assert served.status == 200, served.body
        refused = poll(
            lambda: (r := server.post("/generate", {"prompt": "too late", "max_new_tokens": 2})).status != 200 and r,
            delay_s + 10,
            "a request refused after the delay",
        )
        assert time.monotonic() - sigterm_at >= delay_s
        assert refused.status == 503 and refused.error["code"] == "draining", refused.body
        assert server.proc.wait(STOP_TIMEOUT_S) == 0
        assert time.monotonic() - sigterm_at >= delay_s
        messages = [line["message"] for line in server.log_lines()]
        assert any("new requests are served 5 s more (serving.shutdown_delay_s)" in m for m in messages), messages
        assert "drained: no request in flight; shutting down" in messages
    finally:
        server.stop()


def test_admin_reload(tmp_path: Path, bundle_path: Path, serving_bundle_artifact, second_bundle) -> None:
    first_id = serving_bundle_artifact.bundle.id
    server = start_server(tmp_path / "server", bundle_path, admin_token=ADMIN_TOKEN, **BIG_QUEUE)
    try:
        target = {"bundle": str(second_bundle.path)}
        assert server.post("/admin/reload", target).status == 401
        malformed = server.post("/admin/reload", target, headers={"Authorization": f"Basic {ADMIN_TOKEN}"})
        assert malformed.status == 401 and malformed.headers["www-authenticate"] == "Bearer"
        wrong = server.post("/admin/reload", target, headers={"Authorization": "Bearer not-the-token"})
        assert wrong.status == 403 and wrong.error["type"] == "permission_error"
        auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        typo = server.post("/admin/reload", {**target, "bundel": "x"}, headers=auth)
        assert typo.status == 400 and typo.error["param"] == "bundel"

        # A bundle with one byte changed, in its weights or in a small file, is refused with a
        # message naming the file; the old one keeps serving and answers exactly as before.
        before = greedy_answers(server)
        for name in ("model.safetensors", "tokenizer.json", "serving.json"):
            broken = tmp_path / f"broken-{name}"
            shutil.copytree(second_bundle.path, broken)
            flip_one_byte(broken / name)
            refused = server.post("/admin/reload", {"bundle": str(broken)}, headers=auth)
            assert refused.status == 422 and refused.error["param"] == "bundle"
            assert f"{name}: sha256 does not match the manifest" in refused.error["message"]
            assert server.get("/version").json["bundle_id"] == first_id
        assert server.post("/admin/reload", {"bundle": str(tmp_path / "absent")}, headers=auth).status == 422
        assert server.get("/version").json["bundle_id"] == first_id
        assert greedy_answers(server) == before

        # Requests in flight finish on the old engine; new ones go to the new bundle. Two
        # clients send long requests back to back until the reload has answered, so that
        # some request is in flight at the moment of the swap (checked in the log below).
        reloaded = threading.Event()

        def keep_busy(tag: str) -> list[Reply]:
            replies = [long_predict(server, f"{tag}-0", inputs=100)]
            while not reloaded.is_set():
                replies.append(long_predict(server, f"{tag}-{len(replies)}", inputs=100))
            return replies

        with ThreadPoolExecutor(2) as pool:
            busy = [pool.submit(keep_busy, tag) for tag in ("a", "b")]
            server.wait_running()
            try:
                swapped = server.post("/admin/reload", target, headers=auth)
            finally:
                reloaded.set()
            assert swapped.status == 200, swapped.body
            assert swapped.json["bundle_id"] == second_bundle.id
            assert swapped.json["previous_bundle_id"] == first_id
            after = server.post("/v1/completions", {"model": second_bundle.id, "prompt": "A model", "max_tokens": 3})
            assert after.status == 200 and after.json["model"] == second_bundle.id
            replies = [reply for future in busy for reply in future.result(timeout=300)]
        assert all(r.status == 200 for r in replies), [r.body for r in replies if r.status != 200]
        assert all([o["tokens"] for o in r.json["outputs"]] == [LONG_TOKENS] * 100 for r in replies)
        lines = server.log_lines()
        (swap,) = [line for line in lines if line["message"].startswith("reloaded: now serving")]
        swap_time = dt.datetime.fromisoformat(swap["timestamp"])
        spanning = [
            line
            for line in lines
            if line.get("path") == "/predict"
            and line["request_id"].startswith("long-")
            and dt.datetime.fromisoformat(line["timestamp"]) - dt.timedelta(milliseconds=line["latency_ms"])
            < swap_time
            < dt.datetime.fromisoformat(line["timestamp"])
        ]
        assert spanning, "no request was in flight during the swap"
        assert poll(
            lambda: any(ln["message"].startswith("stopped the engine of retired") for ln in server.log_lines()),
            30,
            "the old engine to stop",
        )
        assert server.get("/version").json["bundle_id"] == second_bundle.id
        assert [m["id"] for m in server.get("/v1/models").json["data"]] == [second_bundle.id]
        assert server.post("/v1/completions", {"model": first_id, "prompt": "a"}).status == 404
        poll(lambda: server.metric("aieng_kv_cache_slots") == 8, 10, "the new engine's 8 slots")
        server.wait_idle(max_batch=8)
    finally:
        assert server.stop() == 0, server.log_tail()


def test_a_bundle_that_cannot_be_served_exits_1(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIENG_")}
    env.update(AIENG_HOME=str(tmp_path / "home"), AIENG_CONFIG=str(TINY_CONFIG))
    result = subprocess.run(
        [AIENG, "serve", "--bundle", str(tmp_path / "no-bundle"), "--port", str(free_port())],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 1, result.stderr[-3000:]
    lines = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    (error,) = [line for line in lines if line["message"].startswith("exiting: the bundle could not be served")]
    assert "manifest.json: missing" in error["message"] and "Traceback" not in result.stderr


def test_serve_deployment_current_follows_promote_and_rollback_without_failing_a_request(
    tmp_path: Path, serving_bundle_artifact, second_bundle
) -> None:
    first_id, second_id = serving_bundle_artifact.bundle.id, second_bundle.id
    home = home_with_both_bundles(second_bundle, tmp_path / "home")
    server = start_server(
        tmp_path / "server", None, admin_token=ADMIN_TOKEN, home=home, wait_for="/health/live", **BIG_QUEUE
    )
    try:

        def serving(bundle_id: str | None) -> Callable[[], bool]:
            def check() -> bool:
                ready = server.get("/health/ready")
                if bundle_id is None:
                    return ready.status == 503 and ready.error["code"] == "no_deployment"
                return ready.status == 200 and ready.json["bundle_id"] == bundle_id

            return check

        # Nothing deployed yet: live, not ready (after loading the engine's code, "loading"),
        # and generation is refused saying why.
        poll(serving(None), 60, "readiness to say nothing is deployed")
        refused = server.post("/generate", {"prompt": "x", "max_new_tokens": 2})
        assert refused.status == 503 and "aieng deploy promote" in refused.error["message"]

        deploy(home, "promote", first_id, "--reason", "first")
        poll(serving(first_id), 60, f"the server to pick up {first_id}")
        version = server.get("/version").json
        assert version["deployment"] == {
            "pointer": "production",
            "bundle_id": first_id,
            "sequence": 1,
            "refused": False,
            "mismatch": None,
            "canary": None,
        }
        # The admin API cannot fight the pointer.
        reload = server.post(
            "/admin/reload", {"bundle": str(second_bundle.path)}, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
        )
        assert reload.status == 409 and reload.error["code"] == "follows_deployment"

        # Promote and roll back under steady traffic: every request answered 200.
        stop = threading.Event()

        def traffic(tag: str) -> list[Reply]:
            replies = []
            while not stop.is_set():
                replies.append(server.post("/generate", {"prompt": f"{tag} {len(replies)}", "max_new_tokens": 8}))
            return replies

        with ThreadPoolExecutor(2) as pool:
            clients = [pool.submit(traffic, tag) for tag in ("a", "b")]
            try:
                # The rollback withdraws the second bundle: promoting it again is asked for explicitly.
                steps = (
                    ("promote", second_id, ("promote", second_id)),
                    ("rollback", first_id, ("rollback",)),
                    ("promote", second_id, ("promote", second_id, "--allow-withdrawn")),
                )
                for action, expected, arguments in steps:
                    deploy(home, *arguments, "--reason", f"drill {action}")
                    poll(serving(expected), 60, f"the server to pick up {expected}")
            finally:
                stop.set()
            replies = [reply for client in clients for reply in client.result(timeout=120)]
        assert replies and all(r.status == 200 for r in replies), [r.body for r in replies if r.status != 200]
        print(f"requests during the switches: {len(replies)}")
        status = deploy(home, "status")
        assert status["current"]["bundle_id"] == second_id
        assert [e["action"] for e in status["history"]] == ["promote", "promote", "rollback", "promote"]
        following = [ln for ln in server.log_lines() if ln["message"].startswith("following the production pointer")]
        assert len(following) == 4  # the first promote, then the three switches
        # From the pointer's switch (its history time) to the new bundle serving (the log line
        # written once it is loaded, verified and warm).
        switch_to_served = [
            (dt.datetime.fromisoformat(line["timestamp"]) - dt.datetime.fromisoformat(event["time"])).total_seconds()
            for line, event in zip(following, status["history"], strict=True)
        ]
        print(f"pointer switch to serving the new bundle (s): {[round(x, 2) for x in switch_to_served]}")
        assert all(0 < seconds < 10 for seconds in switch_to_served), switch_to_served
        assert server.get("/version").json["deployment"]["sequence"] == 4
        agree = {"pointer": "production", "pointer_bundle": second_id, "served_bundle": second_id}
        deployment_series = {k: v for k, v in server.metrics().items() if k[0] == "aieng_deployment_mismatch"}
        assert deployment_series == {("aieng_deployment_mismatch", tuple(sorted(agree.items()))): 0.0}

        # A bundle with one byte of its weights changed: `aieng deploy promote` refuses it
        # naming the file, and changes nothing.
        damaged = home / "artifacts" / "serving_bundle" / first_id / "model.safetensors"
        flip_one_byte(damaged)
        refused = deploy_refused(home, "promote", first_id, "--reason", "a damaged bundle")
        assert "model.safetensors: sha256 does not match the manifest" in refused and "nothing changed" in refused
        assert deploy(home, "status")["sequence"] == 4
        before = greedy_answers(server)
        # `aieng deploy rollback` verifies its target too, and refuses it. Written without
        # verification (the Deployments API), the pointer names the damaged bundle, and the
        # server refuses it; the current one keeps serving (the same answers), and
        # /health/ready, /version and the mismatch gauge say what the pointer names.
        assert "model.safetensors" in deploy_refused(home, "rollback", "--reason", "to a bundle damaged since")
        Deployments(home).rollback(reason="to a bundle damaged since", verify=False)
        poll(lambda: server.get("/version").json["deployment"]["refused"], 60, "the damaged bundle to be refused")
        ready = server.get("/health/ready")
        body = ready.json
        assert ready.status == 200 and body["bundle_id"] == second_id
        mismatch = body["deployment"].pop("mismatch")
        assert body["deployment"] == {
            "pointer": "production",
            "bundle_id": first_id,
            "sequence": 5,
            "refused": True,
            "canary": None,
        }
        assert (mismatch["pointer_bundle"], mismatch["served_bundle"]) == (first_id, second_id)
        assert "model.safetensors: sha256 does not match the manifest" in mismatch["reason"]
        labels = {"pointer": "production", "pointer_bundle": first_id, "served_bundle": second_id}
        assert server.metric("aieng_deployment_mismatch", **labels) == 1
        assert greedy_answers(server) == before
        (refusal,) = [ln for ln in server.log_lines() if "which was refused" in ln["message"]]
        assert "model.safetensors: sha256 does not match the manifest" in refusal["message"]
        assert refusal["level"] == "error"
    finally:
        assert server.stop() == 0, server.log_tail()

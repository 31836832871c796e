"""`aieng deploy canary` for real: the gate's checks, then a rollout through every step to a
real `aieng serve --deployment current` under load, and one a slow candidate breaches, which
rolls back by itself; zero failed requests in both, each request counted by the bundle that
answered (its X-Aieng-Bundle-Id)."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from aieng_core.bundle.serving_bundle import KIND, build_serving_bundle
from aieng_core.deploy.canary import read_history
from aieng_core.deploy.deployments import Deployments
from aieng_core.store import Artifact, ArtifactStore
from aieng_core.store.canary_state import read_canary
from tests.bundle_fixtures import BundledHome
from tests.core.deploy import BundlePair, build_bundle_pair, home_with_bundles
from tests.e2e.serve_helpers import Server, poll, run_deploy, start_server

pytestmark = pytest.mark.e2e

CLIENTS = 4
MAX_REQUESTS = 30_000  # bounded whatever happens (the gate runs before the rollout: tens of seconds of load)
CANARY = ["--steps", "5,25,100", "--hold", "3s", "--min-requests", "10"]
# A candidate as fast as production must not be rolled back by the noise of 10 requests'
# P99 on a busy 2-core machine: 3x. The slow candidate (3x the tokens) is judged at the default 1.5x.
TOLERANT = ["--max-p99-ratio", "3"]


@dataclass
class Load:
    """Generation requests from CLIENTS threads until stopped, each with an id of its own
    (the canary routes by it), taking the bundle's default length; what each got back."""

    server: Server
    stop: threading.Event = field(default_factory=threading.Event)
    answers: list[tuple[int, str]] = field(default_factory=list)  # (status, X-Aieng-Bundle-Id)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self) -> None:
        while not self.stop.is_set() and len(self.answers) < MAX_REQUESTS:
            body = {"prompt": "The data pipeline", "temperature": 0, "request_id": uuid.uuid4().hex}
            reply = self.server.post("/generate", body)
            with self.lock:
                self.answers.append((reply.status, reply.headers.get("x-aieng-bundle-id", "")))

    def __enter__(self) -> Load:
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(CLIENTS)]
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(60)

    def by_bundle(self) -> Counter[str]:
        with self.lock:
            return Counter(bundle for _, bundle in self.answers)

    def failed(self) -> list[tuple[int, str]]:
        with self.lock:
            return [answer for answer in self.answers if answer[0] != 200]


@dataclass(frozen=True)
class Rollouts:
    home: Path
    server: Server
    pair: BundlePair
    slow: Artifact  # the model of A and B, with a default reply three times as long


@pytest.fixture(scope="module")
def rollouts(serving_bundle_artifact: BundledHome, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rollouts]:
    pair = build_bundle_pair(tmp_path_factory.mktemp("canary-pair"), serving_bundle_artifact)
    home = home_with_bundles(tmp_path_factory.mktemp("canary") / "home", pair)
    config = serving_bundle_artifact.config
    recipe = config.bundle.model_copy(update={"default_max_new_tokens": 48})  # tiny.yaml's is 16
    slow = build_serving_bundle(pair.store, config.model_copy(update={"bundle": recipe}))
    shutil.copytree(slow.path, ArtifactStore(home).artifact_dir(KIND, slow.id))
    Deployments(home).promote(pair.a.id, reason="first", verify=False)
    server = start_server(tmp_path_factory.mktemp("canary-server"), None, home=home)
    try:
        yield Rollouts(home, server, pair, slow)
    finally:
        assert server.stop() == 0, server.log_tail()


def canary(home: Path, bundle_id: str, *options: str) -> subprocess.CompletedProcess[str]:
    return run_deploy(home, "canary", bundle_id, *CANARY, *options)


def test_a_canary_through_every_step_under_load_is_promoted(rollouts: Rollouts) -> None:
    home, server = rollouts.home, rollouts.server
    production = Deployments(home)
    before = production.current()["bundle_id"]
    candidate = rollouts.pair.b.id if before != rollouts.pair.b.id else rollouts.pair.a.id
    with Load(server) as load:
        result = canary(home, candidate, *TOLERANT)
        assert result.returncode == 0, result.stderr[-3000:]
        # The server follows the promote: the candidate's replica, already warm, takes everything.
        poll(lambda: server.get("/health/ready").json.get("bundle_id") == candidate, 30, "the promote to be followed")
        after = len(load.answers)
        poll(lambda: len(load.answers) >= after + 20, 60, "requests after the promote")
    assert load.failed() == []
    counts = load.by_bundle()
    print(f"canary promoted: {len(load.answers)} requests, 0 failed, by bundle {dict(counts)}")
    assert set(counts) == {before, candidate} and counts[before] > 0 and counts[candidate] > 0
    report = json.loads(result.stdout)
    steps = report["event"]["figures"]["canary"]["steps"]
    assert [step["share"] for step in steps] == [0.05, 0.25, 1.0]
    assert all(step["candidate"]["requests"] >= 10 and step["candidate"]["errors"] == 0 for step in steps)
    assert [s["name"] for s in report["steps"]][:6] == ["verify", "quality", "warmup", "compare", "stress", "drill"]
    assert production.current()["bundle_id"] == candidate and read_canary(home) is None
    actions = [e["action"] for e in read_history(home) if e["bundle_id"] == candidate]
    assert actions[-5:] == ["start", "step", "step", "step", "promoted"]
    # Every request series names the bundle that answered: both sides are counted apart.
    for bundle in (before, candidate):
        assert server.metric("aieng_http_requests_total", endpoint="/generate", status="200", bundle_id=bundle) > 0
        assert server.metric("aieng_e2e_request_latency_seconds_count", bundle_id=bundle) > 0


def test_a_candidate_breaching_its_latency_slo_is_rolled_back_by_itself(rollouts: Rollouts) -> None:
    home, server, slow = rollouts.home, rollouts.server, rollouts.slow
    production = Deployments(home)
    before = production.current()
    with Load(server) as load:
        result = canary(home, slow.id)
        # No request goes to the candidate once the rollout is over (a poll of the pointer).
        poll(lambda: server.get("/version").json["deployment"]["canary"] is None, 30, "the canary to be dropped")
        after = len(load.answers)
        poll(lambda: len(load.answers) >= after + 20, 60, "requests after the rollback")
        tail = load.answers[after + CLIENTS :]  # (requests in flight at the drop may finish on it)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "gate failed at canary: slo" in result.stderr and "P99 latency" in result.stderr
    failed = json.loads(result.stdout)  # the gate's report, the canary's step failed
    assert (failed["passed"], failed["failure"]["step"], failed["event"]) == (False, "canary", None)
    assert load.failed() == []
    counts = load.by_bundle()
    print(f"canary rolled back: {len(load.answers)} requests, 0 failed, by bundle {dict(counts)}; {result.stderr}")
    assert counts[slow.id] > 0 and counts[before["bundle_id"]] > 0
    assert all(bundle == before["bundle_id"] for _, bundle in tail)
    assert production.current()["sequence"] == before["sequence"] and read_canary(home) is None
    rolled_back = [e for e in read_history(home) if e["bundle_id"] == slow.id][-1]
    assert rolled_back["action"] == "rolled_back" and "P99 latency" in rolled_back["reason"]
    assert rolled_back["steps"][0]["share"] == 0.05  # caught at the first step

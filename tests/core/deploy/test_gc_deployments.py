"""`aieng store gc` on a store of real bundles: three promotions and two rollbacks, gc between
each, and every rollback still verifies and lands (goldens replayed); `store verify` stays clean.
A server holds the bundle it serves, and lets go of it when it switches to another.

The source store holds bundles A and B (tests/core/deploy) and C (a third real build of the same
model, max_batch 4), with the whole chain they were built from, down to the raw snapshots.
"""

from __future__ import annotations

import datetime as dt
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from aieng_core.asset_keys import BENCHMARK_REPORT, MODEL_CHECKPOINT, RAW_DOCUMENTS
from aieng_core.bundle.serving_bundle import KIND, build_serving_bundle
from aieng_core.deploy.deployments import Deployments
from aieng_core.serving.http.app import create_app
from aieng_core.serving.http.following import read_target
from aieng_core.store import Artifact, ArtifactStore
from aieng_core.store.artifacts import MANIFEST
from aieng_core.store.file_lock import try_exclusive
from aieng_core.store.gc import collect_garbage
from aieng_core.store.lineage import upstream
from aieng_core.store.verify import verify_store
from tests.bundle_fixtures import BundledHome
from tests.core.deploy import BundlePair
from tests.core.gc_helpers import craft, dir_bytes
from tests.core.serving.http_helpers import serving

NOW = dt.timedelta(0)
SWITCH_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Trio:
    home: Path  # the source home: copy it to change it
    bundles: dict[str, Artifact]  # "a", "b", "c"
    chain: set[tuple[str, str]]  # every artifact the bundles were built from


@pytest.fixture(scope="module")
def trio(pair: BundlePair, serving_bundle_artifact: BundledHome, tmp_path_factory: pytest.TempPathFactory) -> Trio:
    home = tmp_path_factory.mktemp("gc-trio") / "home"
    store = ArtifactStore(home)
    chain: set[tuple[str, str]] = set()
    for bundle in (pair.a, pair.b):
        for artifact in [bundle, *upstream(pair.store, bundle)]:
            if not store.artifact_dir(artifact.kind, artifact.id).exists():
                shutil.copytree(artifact.path, store.artifact_dir(artifact.kind, artifact.id))
            chain.add((artifact.kind, artifact.id))
        for item in bundle.manifest["inputs"]:  # the model and its report: what bundle C is built from
            store.set_current(store.get(item["kind"], item["id"]))
    config = serving_bundle_artifact.config
    c = build_serving_bundle(
        store, config.model_copy(update={"bundle": config.bundle.model_copy(update={"max_batch": 4})})
    )
    assert c.id not in (pair.a.id, pair.b.id) and store.verify(c) == []
    assert {kind for kind, _ in chain} >= {RAW_DOCUMENTS, MODEL_CHECKPOINT, BENCHMARK_REPORT}
    bundles = {"a": store.get(KIND, pair.a.id), "b": store.get(KIND, pair.b.id), "c": c}
    return Trio(home, bundles, chain - {(KIND, b.id) for b in bundles.values()})


def copy_home(trio: Trio, tmp_path: Path) -> tuple[Path, dict[str, Artifact]]:
    home = tmp_path / "home"
    shutil.copytree(trio.home, home)
    store = ArtifactStore(home)
    return home, {name: store.get(KIND, bundle.id) for name, bundle in trio.bundles.items()}


def keys(entries: list[dict]) -> set[tuple[str, str]]:
    return {(entry["kind"], entry["id"]) for entry in entries}


def assert_store_clean(home: Path, rollback_targets: list[str]) -> None:
    result = verify_store(home)
    assert result["ok"] is True and result["gc_leftovers"] == []
    rollback = [e["bundle_id"] for e in result["deployments"] if e["role"] == "rollback" and e["ok"]]
    assert rollback == rollback_targets


def test_three_promotions_two_rollbacks_and_gc_between_each(trio: Trio, tmp_path: Path) -> None:
    home, b = copy_home(trio, tmp_path)
    store = ArtifactStore(home)
    model = store.get(MODEL_CHECKPOINT, b["a"].manifest["inputs"][0]["id"])
    old_bundle = craft(store, KIND, "an old bundle", (model,))  # unreferenced once C's ref is back
    old_raw = craft(store, RAW_DOCUMENTS, "an old landing", partition="2025-12-31")
    store.set_current(b["c"])  # the newest build is current again, as before the crafted ones
    (store.refs / RAW_DOCUMENTS / "2025-12-31.json").unlink()  # that landing was replaced, then withdrawn
    deployments = Deployments(home)
    for name in ("a", "b", "c"):
        deployments.promote(b[name].id, actor="tester", reason=f"promote {name}")

    sizes = {(KIND, old_bundle.id): dir_bytes(old_bundle.path), (RAW_DOCUMENTS, old_raw.id): dir_bytes(old_raw.path)}
    dry = collect_garbage(home, dry_run=True, keep_newer_than=NOW)
    assert keys(dry["deleted"]) == set(sizes) and old_bundle.path.is_dir() and old_raw.path.is_dir()
    first = collect_garbage(home, keep_newer_than=NOW)
    assert keys(first["deleted"]) == set(sizes) and first["bytes_freed"] == sum(sizes.values()) == dry["bytes_freed"]
    # Kept: the three bundles and everything they reach, down to the raw snapshots.
    assert keys(first["kept"]) == trio.chain | {(KIND, bundle.id) for bundle in b.values()}
    assert first["missing_inputs"] == [] and first["held"] == []
    assert_store_clean(home, [b["b"].id, b["a"].id])

    # Each rollback verifies its target (re-hash, load, goldens) after the gc before it.
    assert deployments.rollback(actor="tester", reason="first")["to"] == b["b"].id
    assert collect_garbage(home, keep_newer_than=NOW)["deleted"] == []  # C is still the current build's ref
    assert_store_clean(home, [b["a"].id])
    assert deployments.rollback(actor="tester", reason="second")["to"] == b["a"].id
    # B was withdrawn by the first rollback and left the stack with the second: nothing reaches it.
    last = collect_garbage(home, keep_newer_than=NOW)
    assert keys(last["deleted"]) == {(KIND, b["b"].id)} and last["bytes_freed"] == dir_bytes(trio.bundles["b"].path)
    assert_store_clean(home, [])
    assert deployments.current()["bundle_id"] == b["a"].id and b["a"].path.is_dir() and b["c"].path.is_dir()
    assert store.verify(b["a"]) == [] and store.verify(b["c"]) == []


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + SWITCH_TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.05)


def is_held(bundle: Artifact) -> bool:
    fd = try_exclusive(bundle.path / MANIFEST)
    if fd is None:
        return True
    os.close(fd)
    return False


def test_a_server_holds_the_bundle_it_serves(trio: Trio, tmp_path: Path, serving_bundle_artifact: BundledHome) -> None:
    """Served by path, A is reached by no root: gc leaves it while it is served, takes it after."""
    home, b = copy_home(trio, tmp_path)
    app = create_app(b["a"].path, serving_bundle_artifact.config, admin_token=None)
    with serving(app) as server:
        assert server.get("/version").status == 200
        result = collect_garbage(home, keep_newer_than=NOW)
        assert keys(result["held"]) == {(KIND, b["a"].id)} and keys(result["deleted"]) == {(KIND, b["b"].id)}
        assert server.post("/generate", {"prompt": "The data pipeline", "max_new_tokens": 2}).status == 200
    after = collect_garbage(home, keep_newer_than=NOW)
    assert keys(after["deleted"]) == {(KIND, b["a"].id)} and after["held"] == []
    assert verify_store(home)["ok"] is True


def test_a_following_server_lets_go_of_the_bundle_it_switched_from(
    trio: Trio, tmp_path: Path, serving_bundle_artifact: BundledHome
) -> None:
    home, b = copy_home(trio, tmp_path)
    deployments = Deployments(home)
    deployments.promote(b["a"].id, actor="tester", verify=False)
    app = create_app(None, serving_bundle_artifact.config, admin_token=None, follow=lambda: read_target(home))
    with serving(app) as server:
        assert server.state.current is not None and server.state.current.bundle_id == b["a"].id
        assert is_held(b["a"]) and not is_held(b["b"])
        deployments.promote(b["b"].id, actor="tester", verify=False)
        wait_until(lambda: server.state.current is not None and server.state.current.bundle_id == b["b"].id, "B serves")
        wait_until(lambda: not is_held(b["a"]), "the server lets go of A")
        assert is_held(b["b"])
        # With no rollback target kept, A (only on the stack now) goes; B, served and current, stays.
        result = collect_garbage(home, keep_newer_than=NOW, rollback_depth=0)
        assert keys(result["deleted"]) == {(KIND, b["a"].id)} and result["held"] == []
    assert verify_store(home)["deployments"][1]["ok"] is False  # the stack names A, gone: as depth 0 says

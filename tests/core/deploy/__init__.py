"""Tests of aieng_core.deploy, and the two real serving bundles they deploy.

Bundle A is the session's serving bundle (tests/bundle_fixtures.py); bundle B is a real build
of the same model with another `bundle:` section (max_batch 8), so it has another id and
verifies on its own. Each test gets a home of its own holding copies of both bundles.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aieng_core.asset_keys import DATASET_MANIFEST
from aieng_core.bundle.serving_bundle import KIND, build_serving_bundle
from aieng_core.store import Artifact, ArtifactStore
from tests.bundle_fixtures import BundledHome


@dataclass(frozen=True)
class BundlePair:
    store: ArtifactStore  # a private copy of the bundled home, holding both bundles
    a: Artifact
    b: Artifact


_built: dict[Path, BundlePair] = {}


def build_bundle_pair(root: Path, bundled: BundledHome) -> BundlePair:
    """Bundles A and B in a private copy of the bundled home under `root`; built once per
    session (both test modules share it: they only read it, copying bundles to change them)."""
    if bundled.home in _built:
        return _built[bundled.home]
    home = root / "pair-home"
    shutil.copytree(bundled.home, home)
    store = ArtifactStore(home)
    recipe = bundled.config.bundle.model_copy(update={"max_batch": 8})
    b = build_serving_bundle(store, bundled.config.model_copy(update={"bundle": recipe}))
    a = store.get(KIND, bundled.bundle.id)
    assert a.id != b.id
    assert store.verify(a) == [] and store.verify(b) == []
    _built[bundled.home] = BundlePair(store, a, b)
    return _built[bundled.home]


def home_with_bundles(home: Path, pair: BundlePair) -> Path:
    """A fresh $AIENG_HOME whose store holds copies of bundles A and B and the dataset their
    model was trained on (the gate's quality step reads its held-out documents)."""
    store = ArtifactStore(home)
    for bundle in (pair.a, pair.b):
        shutil.copytree(bundle.path, store.artifact_dir(KIND, bundle.id))
        dataset = pair.store.get(DATASET_MANIFEST, bundle.manifest["lineage"][DATASET_MANIFEST])
        if not store.artifact_dir(DATASET_MANIFEST, dataset.id).exists():
            shutil.copytree(dataset.path, store.artifact_dir(DATASET_MANIFEST, dataset.id))
    return home


def replay(events: list[dict[str, Any]]) -> tuple[str | None, list[str]]:
    """(current, stack) after the events, each checked to start where the one before ended
    (a rollback pops the withdrawn bundles it passed over, then its target)."""
    current: str | None = None
    stack: list[str] = []
    for event in events:
        assert event["from"] == current, event
        if event["action"] == "promote":
            if current is not None:
                stack.append(current)
        else:
            for skipped in event.get("skipped_withdrawn", []):  # withdrawn bundles passed over
                assert stack.pop() == skipped, event
            assert event["to"] == (stack.pop() if stack else None), event
        current = event["to"]
    return current, stack

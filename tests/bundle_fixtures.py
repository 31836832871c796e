"""Session fixtures: a trained tiny model and its serving bundle, built once per session.

The demo data goes through dataset_manifest with configs/tiny.yaml, the tiny model trains
(seconds), and the bundle is built from it. Tests treat both as read-only: a test that
changes a bundle copies it first (`copy_bundle`).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from aieng_core.config import AiengConfig, load_config
from aieng_core.store import Artifact, ArtifactStore
from tests.conftest import DEMO_PARTITIONS, TINY_CONFIG


@dataclass(frozen=True)
class TrainedHome:
    home: Path
    store: ArtifactStore
    config: AiengConfig
    model: Artifact


@dataclass(frozen=True)
class BundledHome:
    home: Path
    store: ArtifactStore
    config: AiengConfig
    model: Artifact
    bundle: Artifact


@pytest.fixture(scope="session")
def trained_home(tmp_path_factory: pytest.TempPathFactory) -> TrainedHome:
    """The demo data built through dataset_manifest, and model_checkpoint trained on it."""
    from aieng_core.data.demo_data import land_demo_data
    from aieng_core.training.model_checkpoint import build_model_checkpoint
    from tests.core.helpers import build_pipeline

    home = tmp_path_factory.mktemp("trained") / "home"
    land_demo_data(home)
    config = load_config(TINY_CONFIG)
    built = build_pipeline(home, config, DEMO_PARTITIONS)
    model = build_model_checkpoint(built.store, config)
    return TrainedHome(home, built.store, config, model)


@pytest.fixture(scope="session")
def serving_bundle_artifact(trained_home: TrainedHome) -> BundledHome:
    """The serving bundle of the trained tiny model (read-only: copy it to change it)."""
    from aieng_core.bundle.serving_bundle import build_serving_bundle

    bundle = build_serving_bundle(trained_home.store, trained_home.config)
    return BundledHome(trained_home.home, trained_home.store, trained_home.config, trained_home.model, bundle)


@pytest.fixture
def copy_bundle(tmp_path: Path) -> Callable[[Artifact], Path]:
    """Copy a bundle directory into this test's tmp_path, so the test may change it."""

    def copy(bundle: Artifact) -> Path:
        target = tmp_path / "bundle-copy" / bundle.id
        shutil.copytree(bundle.path, target)
        return target

    return copy


@pytest.fixture
def copy_bundled_home(tmp_path: Path) -> Callable[[BundledHome], ArtifactStore]:
    """Copy the bundled home into this test's tmp_path, with the fixture's model and bundle
    current and no other bundle (whatever other tests have built in the shared home)."""
    from aieng_core.bundle.serving_bundle import KIND

    def copy(bundled: BundledHome) -> ArtifactStore:
        target = tmp_path / "bundled-home"
        shutil.copytree(bundled.home, target)
        store = ArtifactStore(target)
        for other in store.list_ids(KIND):
            if other != bundled.bundle.id:
                shutil.rmtree(store.artifact_dir(KIND, other))
        store.set_current(store.get(bundled.model.kind, bundled.model.id))
        store.set_current(store.get(KIND, bundled.bundle.id))
        return store

    return copy

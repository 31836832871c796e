"""Session fixtures: a trained tiny model, its benchmark report and its serving bundle, built
once per session.

The demo data goes through dataset_manifest with configs/tiny.yaml, the tiny model trains
(seconds), its benchmark report is measured (seconds), and the bundle is built from both.
Tests treat them as read-only: a test that changes a bundle copies it first (`copy_bundle`).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from aieng_core.config import AiengConfig, load_config
from aieng_core.store import Artifact, ArtifactSpec, ArtifactStore, Produced
from aieng_core.store.artifacts import MANIFEST
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
def benchmark_report_artifact(trained_home: TrainedHome) -> Artifact:
    """The benchmark report of the trained tiny model, current in the trained home."""
    from aieng_core.benchmark.benchmark_report import build_benchmark_report

    return build_benchmark_report(trained_home.store, trained_home.config)


@pytest.fixture(scope="session")
def serving_bundle_artifact(trained_home: TrainedHome, benchmark_report_artifact: Artifact) -> BundledHome:
    """The serving bundle of the trained tiny model, carrying its benchmark report
    (read-only: copy it to change it)."""
    from aieng_core.bundle.serving_bundle import build_serving_bundle

    # Another test may have made another report current in the shared home: this one is the bundle's.
    trained_home.store.set_current(benchmark_report_artifact)
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
    """Copy the bundled home into this test's tmp_path, with the fixture's model, benchmark
    report and bundle current and no other bundle (whatever other tests have built in the
    shared home)."""
    from aieng_core.bundle.serving_bundle import KIND

    def copy(bundled: BundledHome) -> ArtifactStore:
        target = tmp_path / "bundled-home"
        shutil.copytree(bundled.home, target)
        store = ArtifactStore(target)
        for other in store.list_ids(KIND):
            if other != bundled.bundle.id:
                shutil.rmtree(store.artifact_dir(KIND, other))
        for item in bundled.bundle.manifest["inputs"]:  # the model and its benchmark report
            store.set_current(store.get(item["kind"], item["id"]))
        store.set_current(store.get(KIND, bundled.bundle.id))
        return store

    return copy


def craft_model(store: ArtifactStore, base: Artifact, name: str, metrics: dict) -> Artifact:
    """A model_checkpoint artifact with `base`'s files and other metrics, made current."""

    def produce(staging: Path) -> Produced:
        for path in base.path.iterdir():
            if path.name != MANIFEST:
                shutil.copyfile(path, staging / path.name)
        return Produced(content_sha256=base.content_sha256, metrics=metrics)

    spec = ArtifactSpec(
        kind=base.kind,
        code_version=f"crafted-{name}",
        config_sha256=base.manifest["config_sha256"],
        inputs=tuple((item["kind"], item["id"]) for item in base.manifest["inputs"]),
    )
    return store.build(spec, produce)

"""Fixtures shared by the e2e modules that serve the tiny bundle (test_serve.py,
test_serve_under_load.py): the session bundle's path, and a second bundle of the same model."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="module")
def bundle_path(serving_bundle_artifact) -> Path:
    return serving_bundle_artifact.bundle.path


@pytest.fixture(scope="module")
def second_bundle(serving_bundle_artifact, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Another bundle of the same model, built with other engine limits (bundle:) in a copy of the
    shared home (the session's home and its current pointers stay as they are)."""
    from aieng_core.bundle.serving_bundle import build_serving_bundle
    from aieng_core.store import ArtifactStore

    home = tmp_path_factory.mktemp("second-bundle") / "home"
    shutil.copytree(serving_bundle_artifact.home, home)
    config = serving_bundle_artifact.config
    other = config.model_copy(update={"bundle": config.bundle.model_copy(update={"max_batch": 8})})
    bundle = build_serving_bundle(ArtifactStore(home), other)
    assert bundle.id != serving_bundle_artifact.bundle.id
    return bundle

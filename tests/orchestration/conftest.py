"""The deploy tests' bundle pair (tests/core/deploy: bundles A and B, real builds of the tiny
model that verify on their own) and a fresh home holding both, for the deployment sensors and
the rollback readiness check."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bundle_fixtures import BundledHome
from tests.core.deploy import BundlePair, build_bundle_pair, home_with_bundles


@pytest.fixture(scope="module")
def pair(serving_bundle_artifact: BundledHome, tmp_path_factory: pytest.TempPathFactory) -> BundlePair:
    return build_bundle_pair(tmp_path_factory.mktemp("deploy-pair"), serving_bundle_artifact)


@pytest.fixture
def deploy_home(pair: BundlePair, tmp_path: Path) -> Path:
    return home_with_bundles(tmp_path / "deploy-home", pair)

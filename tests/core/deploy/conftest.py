"""The bundle pair and a fresh home holding it, for the deploy tests that share them."""

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

"""The gate's compare step on its own: what it records when there is nothing to measure."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from aieng_core.deploy.deployments import Deployments
from aieng_core.gate.compare import compare_step
from tests.bundle_fixtures import BundledHome
from tests.core.deploy import BundlePair, build_bundle_pair, home_with_bundles


@pytest.fixture(scope="module")
def pair(serving_bundle_artifact: BundledHome, tmp_path_factory: pytest.TempPathFactory) -> BundlePair:
    return build_bundle_pair(tmp_path_factory.mktemp("compare-pair"), serving_bundle_artifact)


def test_a_deployed_bundle_that_cannot_be_loaded_is_said_not_raised(
    pair: BundlePair, serving_bundle_artifact: BundledHome, tmp_path: Path
) -> None:
    """Production serves A, and A's directory is gone: the candidate is not compared, the figures
    say why, and the gate goes on to the steps that decide (a missing rollback target is
    production's problem, which `aieng store verify` reports)."""
    home = home_with_bundles(tmp_path / "home", pair)
    production = Deployments(home)
    production.promote(pair.a.id, actor="tester", verify=False)
    shutil.rmtree(production.store.artifact_dir("serving_bundle", pair.a.id))
    candidate = production.store.get("serving_bundle", pair.b.id).path
    figures = compare_step(candidate, production, serving_bundle_artifact.config)
    assert (figures["deployed_bundle_id"], figures["throughput"]) == (pair.a.id, [])
    assert figures["note"].startswith(f"not compared: the deployed bundle {pair.a.id} cannot be loaded: ")

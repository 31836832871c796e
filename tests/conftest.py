"""Shared fixtures: a temporary AIENG_HOME, the tiny config, landed demo data."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from aieng_core.config import AiengConfig, load_config
from aieng_core.data.demo_data import land_demo_data
from aieng_core.store import ArtifactStore

REPO_ROOT = Path(__file__).resolve().parent.parent
TINY_CONFIG = REPO_ROOT / "configs" / "tiny.yaml"
DEMO_PARTITIONS = ["2026-01-01", "2026-01-02", "2026-01-03"]

# The code location reads its config once, when first imported (orchestration/partitions.py):
# make that the tiny config for the whole session, whatever the caller's environment says.
os.environ["AIENG_CONFIG"] = str(TINY_CONFIG)


@pytest.fixture(autouse=True)
def _isolated_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No test reads or writes the developer's ./.aieng or their AIENG_* (or OTEL_*) variables."""
    monkeypatch.setenv("AIENG_HOME", str(tmp_path / "aieng-home"))
    monkeypatch.setenv("AIENG_CONFIG", str(TINY_CONFIG))
    # A promote or rollback reports to the Dagster webserver this names: never the developer's.
    monkeypatch.delenv("AIENG_DAGSTER_URL", raising=False)
    # Nor does a server in this process export traces to the developer's collector.
    for name in [name for name in os.environ if name.startswith("OTEL_")]:
        monkeypatch.delenv(name)


@pytest.fixture(autouse=True)
def _no_dagster_state_storage_left_over() -> Iterator[None]:
    """Each test starts with no current Dagster DefsStateStorage. `with DagsterInstance(...)`
    sets one and its __exit__ (1.13.27) never resets it, so after that instance is gone every
    later `get_repository_def` in the process fails on a dead weakref. Only when dagster is
    loaded already: the core tests never import it."""
    if "dagster" not in sys.modules:
        yield
        return
    from dagster._core.storage.defs_state.base import set_defs_state_storage

    with set_defs_state_storage(None):
        yield


@pytest.fixture
def tiny_config() -> AiengConfig:
    return load_config(TINY_CONFIG)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    path = tmp_path / "aieng-home"
    path.mkdir(exist_ok=True)
    return path


@pytest.fixture
def store(home: Path) -> ArtifactStore:
    return ArtifactStore(home)


@pytest.fixture
def demo_home(home: Path) -> Path:
    land_demo_data(home)
    return home


def land(home: Path, partition: str, name: str, data: bytes) -> Path:
    """Land one raw file for a partition, as an upstream system would."""
    folder = home / "raw" / partition
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(data)
    return path


# Fixtures that build a trained model and a serving bundle once per session (tests/bundle_fixtures.py).
pytest_plugins = ["tests.bundle_fixtures"]

"""Fixtures of the core tests: the demo data pushed through the whole data half, built once.

Building is the slow part, so each built home is session-scoped and shared. Tests treat a
shared home as read-only; a test that changes state works on `copy_home(...)`.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from aieng_core.config import load_config
from aieng_core.data.demo_data import land_demo_data
from tests.conftest import DEMO_PARTITIONS, TINY_CONFIG
from tests.core.helpers import BuiltHome, build_pipeline


@pytest.fixture(scope="session")
def built_demo(tmp_path_factory: pytest.TempPathFactory) -> BuiltHome:
    """The demo data landed as `aieng demo-data` lands it, built through dataset_manifest."""
    home = tmp_path_factory.mktemp("built-demo") / "home"
    land_demo_data(home)
    return build_pipeline(home, load_config(TINY_CONFIG), DEMO_PARTITIONS)


@pytest.fixture(scope="session")
def built_demo_reversed(tmp_path_factory: pytest.TempPathFactory) -> BuiltHome:
    """The same raw bytes, at another path, landed file by file in reverse order with
    different modification times, and built partition by partition in reverse order."""
    staging = tmp_path_factory.mktemp("demo-staging")
    written = land_demo_data(staging)
    home = tmp_path_factory.mktemp("built-demo-reversed") / "elsewhere" / "home"
    for age, source in enumerate(reversed(written)):
        relative = source.relative_to(staging)
        target = home / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(source.read_bytes())
        os.utime(target, (1_000_000_000 + age * 3600, 1_000_000_000 + age * 3600))
    return build_pipeline(home, load_config(TINY_CONFIG), list(reversed(DEMO_PARTITIONS)))


@pytest.fixture
def copy_home(tmp_path: Path):
    """Copy a shared built home into this test's tmp_path, so the test may change it."""

    def copy(built: BuiltHome) -> Path:
        target = tmp_path / "copied-home"
        shutil.copytree(built.home, target)
        return target

    return copy

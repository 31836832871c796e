"""Helpers of the e2e tests that run the `aieng` and `dagster` CLIs as an operator does: a
temporary AIENG_HOME and DAGSTER_HOME with the tiny config, commands run with a bound, and a
snapshot of every artifact's manifest (to tell a reuse from a rebuild)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from aieng_core.store import ArtifactStore

REPO_ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
AIENG = str(BIN / "aieng")
DAGSTER = str(BIN / "dagster")
PARTITIONS = ["2026-01-01", "2026-01-02", "2026-01-03"]
PARTITION_RANGE = f"{PARTITIONS[0]}...{PARTITIONS[-1]}"
TIMEOUT_S = 300
# dataset_manifest and everything upstream of it: the data half of the graph. (Plain '*' now
# also reaches model_checkpoint and whatever lands after it, which these tests don't cover.)
DATA_HALF = "*dataset_manifest"


@dataclass
class Env:
    home: Path
    vars: dict[str, str]

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(args), cwd=REPO_ROOT, env=self.vars, capture_output=True, text=True, timeout=TIMEOUT_S, check=False
        )

    def run_ok(self, *args: str) -> subprocess.CompletedProcess[str]:
        result = self.run(*args)
        assert result.returncode == 0, (
            f"{args} exited {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
        )
        return result

    def materialize(self, *selection_args: str) -> subprocess.CompletedProcess[str]:
        return self.run(DAGSTER, "asset", "materialize", "-m", "orchestration.definitions", *selection_args)

    @property
    def store(self) -> ArtifactStore:
        return ArtifactStore(self.home)


def make_env(root: Path) -> Env:
    root = root.resolve()  # the CLIs resolve AIENG_HOME; compare like with like
    home = root / "aieng-home"
    dagster_home = root / "dagster"
    dagster_home.mkdir(parents=True)
    shutil.copy(REPO_ROOT / "configs" / "dagster.yaml", dagster_home / "dagster.yaml")
    env = dict(os.environ)
    env.update(
        AIENG_HOME=str(home),
        DAGSTER_HOME=str(dagster_home),
        AIENG_CONFIG="configs/tiny.yaml",
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
    )
    return Env(home=home, vars=env)


def artifact_snapshot(home: Path) -> dict[str, str]:
    """Every artifact directory, with the SHA-256 of its manifest.json (a rebuilt artifact gets
    a new created_at and run id, so any rewrite shows)."""
    return {
        path.parent.relative_to(home / "artifacts").as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted((home / "artifacts").glob("*/*/manifest.json"))
    }

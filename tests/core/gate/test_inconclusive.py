"""A gate the machine was too busy to decide, for real: `aieng deploy gate` in a process of its
own on the tiny bundle A (tests/core/deploy), forced busy by `gate.busy_cores_limit: 0` (any
measured load is enough) with an SLO no server meets, then gated again with the tiny config.

The forced gate must end inconclusive (exit 75, one line, the report saying so, production
unchanged) and must not count against the bundle: the second gate runs every step and promotes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from aieng_core.deploy.deployments import Deployments
from tests.bundle_fixtures import BundledHome
from tests.conftest import TINY_CONFIG
from tests.core.deploy import BundlePair, build_bundle_pair, home_with_bundles

pytestmark = pytest.mark.e2e

# One stress level keeps it short; 48 requests one at a time take longer than a CPU sampling
# window (50 ms), so the level's load is measured (an unmeasured level is never excused).
BUSY_GATE = {"busy_cores_limit": 0, "slo_ttft_p99_ms": 0.001, "concurrencies": [1], "poisson_rates": []}
BUSY_GATE |= {"requests_per_level": 48}


@pytest.fixture(scope="module")
def pair(serving_bundle_artifact: BundledHome, tmp_path_factory: pytest.TempPathFactory) -> BundlePair:
    return build_bundle_pair(tmp_path_factory.mktemp("inconclusive-pair"), serving_bundle_artifact)


def aieng(home: Path, config: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "aieng_core.cli", "--home", str(home), "--config", str(config), *argv]
    return subprocess.run(command, capture_output=True, text=True, timeout=300)


def test_a_busy_gate_is_inconclusive_and_a_rerun_gates_normally(pair: BundlePair, tmp_path: Path) -> None:
    home = home_with_bundles(tmp_path / "home", pair)
    settings = yaml.safe_load(TINY_CONFIG.read_text(encoding="utf-8"))
    settings["gate"].update(BUSY_GATE)
    busy = tmp_path / "busy.yaml"
    busy.write_text(yaml.safe_dump(settings), encoding="utf-8")

    done = aieng(home, busy, "deploy", "gate", pair.a.id, "--json")
    assert done.returncode == 75, done.stderr
    # One line of the command's own, the last (the serving engine's warnings may come before it).
    (line,) = [said for said in done.stderr.splitlines(keepends=True) if said.startswith("aieng:")]
    assert done.stderr.endswith(line), done.stderr
    assert line.startswith("aieng: inconclusive: the machine was busy (other processes took "), line
    assert " of " in line and " cores during concurrency=1; there concurrency=1.ttft_ms.p99 = " in line
    assert "a re-run can pass (report: " in line and line.endswith("; production unchanged; run the gate again\n")
    report = json.loads(done.stdout)
    assert (report["outcome"], report["passed"], report["event"]) == ("inconclusive", False, None)
    assert report["failure"]["outcome"] == "inconclusive" and report["failure"]["step"] == "stress"
    assert [(s["name"], s["passed"]) for s in report["steps"]] == [
        ("verify", True),
        ("quality", True),
        ("warmup", True),
        ("compare", True),
        ("stress", False),
    ]
    stress = report["steps"][-1]["figures"]
    (measured,) = stress["levels"].values()
    assert measured["others_cores"] >= 0 and measured["ours_cores"] > 0
    assert stress["cpu"]["cores"] >= 1 and stress["cpu"]["busy_cores_limit"] == 0
    assert stress["outcome"] == "inconclusive"
    assert json.loads(Path(report["path"]).read_text(encoding="utf-8")) == report
    assert Deployments(home).status()["history"] == []  # production unchanged: nothing deployed

    # Nothing refuses the bundle now: the same gate, on the tiny config, runs every step and promotes.
    again = aieng(home, TINY_CONFIG, "deploy", "gate", pair.a.id, "--json")
    assert again.returncode == 0, again.stderr
    passed = json.loads(again.stdout)
    assert (passed["outcome"], passed["passed"]) == ("passed", True)
    assert [s["name"] for s in passed["steps"]] == [
        "verify",
        "quality",
        "warmup",
        "compare",
        "stress",
        "drill",
        "promote",
    ]
    assert passed["steps"][4]["figures"]["outcome"] == "passed"
    assert Deployments(home).current()["bundle_id"] == pair.a.id

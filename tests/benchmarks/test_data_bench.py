"""Smoke test of `aieng bench data`: tiny sizes, the config from $AIENG_CONFIG, results as JSON.

The figures themselves are not judged here (a test machine's load decides them); their
presence, their consistency with each other and with the goals recorded are.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import operator
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from aieng_core import cli
from aieng_core.bench.data_bench import GOALS, bench_partitions, goals
from aieng_core.config import DataConfig
from tests.conftest import REPO_ROOT, TINY_CONFIG

pytestmark = pytest.mark.e2e  # runs `dagster asset materialize` and fresh Python processes

OPERATORS = {">=": operator.ge, "<": operator.lt, "<=": operator.le}
# Every figure a reader of the JSON relies on: (section, key[, sub-key]).
FIGURES = [
    ("raw_to_tokenized", "raw_mb"),
    ("raw_to_tokenized", "tokens"),
    ("raw_to_tokenized", "pipeline_mb_s"),
    ("raw_to_tokenized", "encode_mb_s"),
    ("raw_to_tokenized", "fraction_of_encode_batch_fast"),
    ("raw_to_tokenized", "tokenized_stage_fraction_of_encode_batch_fast"),
    ("raw_to_tokenized", "pipeline_seconds", "raw"),
    ("raw_to_tokenized", "pipeline_seconds", "clean"),
    ("raw_to_tokenized", "pipeline_seconds", "tokenized"),
    ("raw_to_tokenized", "pipeline_seconds", "total"),
    ("dagster_cli", "raw_mb"),
    ("dagster_cli", "tokens"),
    ("dagster_cli", "cli_seconds"),
    ("dagster_cli", "fixed_seconds_per_call"),
    ("dagster_cli", "code_location_import_seconds"),
    ("dagster_cli", "vs_bare_clean_encode"),
    ("dagster_cli", "peer_seconds", "parse"),
    ("dagster_cli", "peer_seconds", "clean"),
    ("dagster_cli", "peer_seconds", "encode"),
    ("clean_validate", "ours_mb_s"),
    ("clean_validate", "speedup_vs_per_row_pydantic"),
    ("hashing", "file_hashing_mb_s"),
    ("hashing", "file_digest_mb_s"),
    ("hashing", "file_hashing_vs_file_digest"),
    ("hashing", "content_hashing_mb_s"),
    ("hashing", "hashlib_mb_s"),
    ("hashing", "content_hashing_vs_hashlib"),
    ("memory", "large_peak_rss_mib"),
    ("memory", "time_ratio"),
    ("memory", "size_ratio"),
]
# Where each goal's value comes from in the results.
GOAL_SOURCES = {
    "raw_to_tokenized_vs_encode_batch_fast": ("raw_to_tokenized", "fraction_of_encode_batch_fast"),
    "dagster_cli_vs_bare_clean_encode": ("dagster_cli", "vs_bare_clean_encode"),
    "file_hashing_vs_file_digest": ("hashing", "file_hashing_vs_file_digest"),
    "content_hashing_vs_hashlib": ("hashing", "content_hashing_vs_hashlib"),
    "large_partition_peak_rss_mib": ("memory", "large_peak_rss_mib"),
    "large_vs_small_time_ratio": ("memory", "time_ratio"),
}


def figure(results: dict[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = results
    for key in path:
        value = value[key]
    return value


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    out = tmp_path_factory.mktemp("bench") / "data.json"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("AIENG_CONFIG", str(TINY_CONFIG))
        env.setenv("AIENG_HOME", str(tmp_path_factory.mktemp("unused-home")))
        argv = ["bench", "data", "--size-mb", "0.3", "--large-mb", "0.6", "--cli-mb", "0.3", "--out", str(out)]
        assert cli.main(argv) == 0
    yield json.loads(out.read_text(encoding="utf-8"))


def test_the_config_comes_from_aieng_config(results: dict[str, Any]) -> None:
    assert results["config"] == str(TINY_CONFIG.resolve())


def test_every_figure_is_present_and_positive(results: dict[str, Any]) -> None:
    for path in FIGURES:
        value = figure(results, path)
        assert isinstance(value, int | float) and math.isfinite(value) and value > 0, (path, value)


def test_the_peers_are_named(results: dict[str, Any]) -> None:
    rt, cli_run = results["raw_to_tokenized"], results["dagster_cli"]
    assert rt["peer"] in rt["peer_seconds"] and rt["peer"].startswith("encode_batch_fast")
    # The bar is the faster way to call the peer.
    assert rt["peer_seconds"][rt["peer"]] == min(rt["peer_seconds"].values())
    assert "encode_batch_fast" in rt["peer_call"] and "encode_special_tokens=True" in rt["peer_call"]
    assert "clean_text" in cli_run["peer"] and "encode_batch_fast" in cli_run["peer"]
    assert "file_digest" in results["hashing"]["file_peer"]


def test_the_figures_agree_with_each_other(results: dict[str, Any]) -> None:
    rt, cli_run = results["raw_to_tokenized"], results["dagster_cli"]
    stages = rt["pipeline_seconds"]
    assert stages["raw"] + stages["clean"] + stages["tokenized"] == pytest.approx(stages["total"], rel=1e-3)
    assert rt["fraction_of_encode_batch_fast"] == pytest.approx(rt["peer_seconds"][rt["peer"]] / stages["total"])
    assert list(cli_run["call_seconds"]) == ["raw_documents,clean_documents", "tokenized_documents"]
    assert sum(cli_run["call_seconds"].values()) == pytest.approx(cli_run["cli_seconds"])
    bare = cli_run["peer_seconds"]
    assert bare["total"] == pytest.approx(bare["parse"] + bare["clean"] + bare["encode"])
    assert cli_run["vs_bare_clean_encode"] == pytest.approx(bare["total"] / cli_run["cli_seconds"])
    # The CLI built the same partition the in-process pipeline builds from the same sizes' text.
    assert cli_run["tokens"] > 0 and cli_run["rows"] > 0


def test_every_goal_is_recorded_and_consistent_with_its_figure(results: dict[str, Any]) -> None:
    assert set(results["goals"]) == set(GOALS) == set(GOAL_SOURCES)
    for name, recorded in results["goals"].items():
        op, goal = GOALS[name]
        assert recorded["value"] == figure(results, GOAL_SOURCES[name])
        assert recorded["goal"] == f"{op} {goal}"
        assert recorded["met"] is OPERATORS[op](recorded["value"], goal)
        if recorded["met"]:
            assert recorded["missed_by"] is None
        else:
            assert recorded["missed_by"] == pytest.approx(abs(recorded["value"] - goal))


def test_a_missed_goal_says_by_how_much() -> None:
    values = dict.fromkeys(GOALS, 0.5)
    values["large_partition_peak_rss_mib"] = 1200.0
    recorded = goals(values)
    assert recorded["raw_to_tokenized_vs_encode_batch_fast"] == {
        "value": 0.5,
        "goal": ">= 0.8",
        "met": False,
        "missed_by": pytest.approx(0.3),
    }
    assert recorded["large_partition_peak_rss_mib"]["missed_by"] == pytest.approx(176.0)
    assert recorded["large_vs_small_time_ratio"] == {"value": 0.5, "goal": "<= 11.0", "met": True, "missed_by": None}


def test_bench_partitions_are_days_the_dagster_cli_accepts() -> None:
    days = bench_partitions(DataConfig(start_date=dt.date(2026, 1, 1)))
    assert len(set(days.values())) == len(days)
    assert all(day > "2026-01-03" for day in days.values())  # after the demo days
    assert days["cli"] <= dt.date.today().isoformat()
    with pytest.raises(ValueError, match="too recent"):
        bench_partitions(DataConfig(start_date=dt.date.today()))


def test_peak_rss_of_a_fresh_process_is_its_own_not_its_parents() -> None:
    # Linux keeps ru_maxrss across fork and exec: a child of a process holding 512 MiB would
    # report at least that, and the small partition's run would look as big as the large one's.
    held = b"\x01" * (512 << 20)
    code = "from aieng_core.bench.partition_run import peak_rss_mib; print(peak_rss_mib())"
    child = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    assert 0 < float(child.stdout) < 400 < len(held) >> 20

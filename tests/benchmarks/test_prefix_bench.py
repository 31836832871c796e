"""`aieng bench prefix`, a quick run on the tiny config: each peer in a fresh process, the same
tokens with and without the cache, and exactly the hits the shared system prompt gives (the
speed figures are the machine's, not checked here)."""

from __future__ import annotations

import json
import os

import pytest

from aieng_core.bench.prefix_bench import PEERS, format_prefix_results, run_prefix_bench
from aieng_core.serving.prefix_cache import BLOCK_TOKENS
from tests.conftest import TINY_CONFIG

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("bench") / "prefix.json"
    returned = run_prefix_bench(out=str(out), config=str(TINY_CONFIG), quick=True)
    written = json.loads(out.read_text())
    assert written == json.loads(json.dumps(returned))
    return written


def test_the_peers_ran_in_fresh_processes_and_generated_the_same_tokens(results: dict) -> None:
    (record,) = results["rounds"]
    assert record["order"] == list(PEERS)
    pids = {record[peer]["pid"] for peer in PEERS}
    assert len(pids) == 2 and os.getpid() not in pids
    assert results["same_tokens_with_and_without"] is True
    assert record["off"]["digest"] == record["on"]["digest"]


def test_the_hits_are_the_shared_system_prompts_blocks(results: dict) -> None:
    # The tiny context (64) gets a 32-token system prompt (2 blocks) and user texts of
    # 16, 24, 24 and 24 tokens: 216 prompt tokens per workload.
    on = results["rounds"][0]["on"]["workloads"]
    system = 2 * BLOCK_TOKENS
    assert on["sequential"]["prompt_tokens"] == on["burst"]["prompt_tokens"] == 216
    assert on["sequential"]["hit_tokens"] == 3 * system  # the first request finds the cache cold
    assert on["burst"]["hit_tokens"] == 4 * system  # the system prompt is cached by then
    assert results["hit_rate"] == {"sequential": 96 / 216, "burst": 128 / 216}
    off = results["rounds"][0]["off"]["workloads"]
    assert off["sequential"]["hit_tokens"] == off["burst"]["hit_tokens"] == 0
    for workload in ("sequential", "burst"):
        figure = results["figures"]["on"][workload]["ttft_ms_median"]
        assert figure["median"] > 0 and results["ttft_speedup"][workload] > 0
    assert "hit rate (on): sequential 0.444, burst 0.593" in format_prefix_results(results)

"""The promotion gate run for real: the tiny bundles A and B (tests/core/deploy), real
`aieng serve` subprocesses for the stress test and the rollback drill, production's pointer
and history read back from disk.

One module-scoped home is gated twice (A as a first deployment, then B with production
serving A); the failure paths each run on a home of their own or leave the shared one as
they found it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from aieng_core.config import AiengConfig, load_config
from aieng_core.cpu.governor import thread_ladder
from aieng_core.cpu.quota import usable_cores
from aieng_core.deploy.deployments import DeploymentError, Deployments
from aieng_core.gate import DRILL_POINTER, GateFailed, GateReport, read_report, reports_dir, run_gate
from aieng_core.gate.production_deployment import PROMOTE_REASON
from tests.bundle_fixtures import BundledHome
from tests.conftest import TINY_CONFIG
from tests.core.deploy import BundlePair, build_bundle_pair, home_with_bundles, replay

pytestmark = pytest.mark.e2e

STEPS = ["verify", "quality", "warmup", "compare", "stress", "drill", "promote"]
LEVELS = {"concurrency=1", "concurrency=4", "poisson=8"}  # configs/tiny.yaml's gate: section


def with_gate(config: AiengConfig, **gate: Any) -> AiengConfig:
    return config.model_copy(update={"gate": config.gate.model_copy(update=gate)})


@dataclass(frozen=True)
class Gated:
    home: Path
    pair: BundlePair
    first: GateReport
    second: GateReport
    status_after_first: dict[str, Any]


@pytest.fixture(scope="module")
def pair(serving_bundle_artifact: BundledHome, tmp_path_factory: pytest.TempPathFactory) -> BundlePair:
    return build_bundle_pair(tmp_path_factory.mktemp("gate-pair"), serving_bundle_artifact)


@pytest.fixture(scope="module")
def gated(pair: BundlePair, tmp_path_factory: pytest.TempPathFactory) -> Gated:
    home = home_with_bundles(tmp_path_factory.mktemp("gate") / "home", pair)
    config = load_config(TINY_CONFIG)
    first = run_gate(home, config, pair.a.id, run_id="run-a", actor="gate-test")
    status_after_first = Deployments(home).status()
    # The speed decision's error rates are measured by scripts/gate_error_rates.py (minutes of
    # load); here B (A's model) is compared with A for real, the decision checked on its figures.
    second = run_gate(home, config, pair.b.id, run_id="run-b", actor="gate-test")
    for report in (first, second):
        for step in report.steps:
            print(f"{report.bundle_id[:12]} {step.name}: {step.seconds:.2f} s")
    drill = second.step("drill").figures
    print(f"pickup {drill['pickup_seconds']:.2f} s, time to rollback {drill['time_to_rollback_seconds']:.2f} s")
    return Gated(home, pair, first, second, status_after_first)


def test_a_first_deployment_passes_every_step_and_promotes(gated: Gated) -> None:
    report, a = gated.first, gated.pair.a
    assert report.passed and report.failure is None
    assert [step.name for step in report.steps] == STEPS and all(step.passed for step in report.steps)
    status = gated.status_after_first
    assert status["current"]["bundle_id"] == a.id and status["sequence"] == 1 and status["stack"] == []
    (event,) = status["history"]
    assert (event["action"], event["from"], event["to"]) == ("promote", None, a.id)
    assert (event["actor"], event["reason"], event["dagster_run_id"]) == ("gate-test", PROMOTE_REASON, "run-a")
    assert event == report.event
    figures = event["figures"]
    assert set(figures) == {*STEPS[:-1], "gate"}
    assert {name: figures[name] for name in STEPS[:-1]} == {s.name: s.figures for s in report.steps[:-1]}
    assert figures["gate"]["report"] == report.path
    assert figures["gate"]["step_seconds"].keys() == set(STEPS[:-1])
    # The report on disk is the report returned.
    assert read_report(Path(report.path)) == report.as_dict()
    assert Path(report.path).parent == reports_dir(gated.home)


def test_verify_and_warmup_figures(gated: Gated) -> None:
    verify = gated.first.step("verify").figures
    assert (verify["goldens_replayed"], verify["goldens_matching"], verify["problems"]) == (
        5,
        5,
        [],
    )  # 3 golden prompts, 2 golden conversations
    warmup = gated.first.step("warmup").figures
    assert warmup["device"] == "cpu"
    # configs/tiny.yaml keeps the test servers eager (tests/core/serving/test_step_graphs.py captures).
    assert warmup["step_graphs"]["status"] == "not captured: serving.step_graphs is eager"
    # max_batch 16: buckets 1..16, at each thread count the server may step at (2 and 1 on 2 cores).
    counts = warmup["step_graphs"]["thread_counts"]
    assert counts == list(thread_ladder(usable_cores())) and warmup["threads"] == counts[0]
    assert [(b["threads"], b["batch"], b["captured"]) for b in warmup["step_graphs"]["buckets"]] == [
        (n, batch, False) for n in counts for batch in (1, 2, 4, 8, 16)
    ]
    assert warmup["cuda_max_memory_allocated_bytes"] is None
    assert [b["prompt_tokens"] for b in warmup["warmup_buckets"]] == [4, 16]
    assert warmup["cold_first_request_ms"] > 0 and warmup["warm_first_request_ms"] > 0
    assert 0 < warmup["peak_memory_bytes"] == warmup["rss_increase_bytes"] < warmup["memory_budget_bytes"]
    # weights x 1.3 + 2 GiB (model/memory.py rounds to 1e-4 GiB)
    assert abs(warmup["memory_budget_bytes"] - (warmup["weights_bytes"] * 1.3 + 2 * 2**30)) < 2**20


def test_quality_is_scored_on_held_out_text_beside_what_serves(gated: Gated) -> None:
    """A first deployment has only the unigram floor; B (A's model) scores what A scores."""
    first = gated.first.step("quality").figures
    assert first["deployed_bundle_id"] is None and "deployed" not in first
    assert first["note"] == "first deployment: only the unigram floor applies"
    (text,) = first["texts"]
    assert text["name"] == "candidate_validation" and text["documents"] > 0 and text["bytes"] > 0
    assert 0 < first["candidate"]["bits_per_byte"] < first["unigram"]["bits_per_byte"]
    second = gated.second.step("quality").figures
    assert second["deployed"]["bundle_id"] == gated.pair.a.id and second["candidate"]["bundle_id"] == gated.pair.b.id
    assert second["note"] == "both models were trained on the same dataset: one held-out text"
    assert second["candidate"]["bits_per_byte"] == second["deployed"]["bits_per_byte"]  # one model, one text
    assert second["candidate"]["bits_per_byte"] == first["candidate"]["bits_per_byte"]
    assert second["worse_by"] == 0.0


def test_compare_serves_both_bundles_interleaved_in_fresh_servers(gated: Gated) -> None:
    first = gated.first.step("compare").figures
    assert (first["deployed_bundle_id"], first["compared"]) == (None, False)
    assert first["note"].startswith("first deployment")
    second = gated.second.step("compare").figures
    assert (second["deployed_bundle_id"], second["compared"]) == (gated.pair.a.id, True)
    # configs/tiny.yaml: 2 rounds, each with a fresh server per bundle, sent the same requests in pairs.
    assert [(t["round"], t["side"]) for t in second["turns"]] == [
        (1, "candidate"),
        (1, "deployed"),
        (2, "candidate"),
        (2, "deployed"),
    ]
    assert all(t["exit_code"] == 0 and t["ready_seconds"] > 0 for t in second["turns"])
    assert all(t["others_cores"] >= 0 for t in second["turns"])  # recorded; the decision does not use it
    decision = second["decision"]
    assert decision["requests"] == 2 * second["requests_per_turn"] == 16
    low, high = decision["interval"]
    assert low <= decision["ratio"] <= high and decision["limit"] == 1.10 and decision["confidence"] == 0.99
    assert decision["regression"] is (low > 1.10) is False  # the gate passed
    assert second["note"].startswith(f"candidate vs deployed {gated.pair.a.id}, served in this run: ")


def test_stress_figures_at_every_level(gated: Gated) -> None:
    stress = gated.first.step("stress").figures
    assert set(stress["levels"]) == LEVELS
    for name, level in stress["levels"].items():
        assert (level["planned"], level["sent"], level["completed"]) == (12, 12, 12), name
        assert (level["errors"], level["unsent"], level["rejected_429"]) == (0, 0, 0), name
        assert level["output_tokens"] == 6 * 4 + 6 * 8  # max_new_tokens [4, 8] cycled, ignore_eos
        for metric in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
            assert set(level[metric]) == {"mean", "p50", "p90", "p99"}, (name, metric)
            assert 0 < level[metric]["p50"] <= level[metric]["p99"], (name, metric)
        assert level["ttft_ms"]["p99"] <= 5000 and level["e2el_ms"]["p99"] <= 10000
        assert level["good_fraction"] >= 0.5
    assert stress["levels"]["concurrency=4"]["concurrency"] == 4
    assert stress["levels"]["poisson=8"]["rate_per_s"] == 8.0
    assert stress["violations"] == [] and stress["server"]["exit_code"] == 0
    assert stress["outcome"] == "passed" and gated.first.outcome == "passed"
    # The CPU other processes took on ours, per level and over all of them (gate/busy.py); a level
    # shorter than a sampling window (50 ms: tiny's closed loops may be) is not measured. The
    # Poisson level's seeded arrivals span half a second.
    poisson = stress["levels"]["poisson=8"]
    assert poisson["others_cores"] >= 0 and poisson["ours_cores"] > 0
    assert all(level["others_cores"] is None or level["others_cores"] >= 0 for level in stress["levels"].values())
    assert stress["cpu"]["others_cores"] >= 0 and 1 <= stress["cpu"]["cores"] <= stress["cpu"]["cpus"]
    assert "regression" not in stress  # recorded figures of another run are never compared with


def test_first_deployment_drill_rolls_back_to_no_bundle(gated: Gated) -> None:
    drill, a = gated.first.step("drill").figures, gated.pair.a
    assert drill["first_deployment"] is True and drill["previous_bundle_id"] is None
    for phase in ("promote", "repromote"):
        assert drill[phase]["to"] == a.id
        assert drill[phase]["goldens"] == {"checked": 5, "matching": 5, "mismatches": []}
    assert drill["rollback"] == {**drill["rollback"], "to": None, "readiness": "503 no_deployment"}
    assert drill["traffic"]["failed_requests"] == 0 and drill["traffic"]["ok"] > 0
    assert drill["traffic"]["clients"] == 2
    assert 0 < drill["time_to_rollback_seconds"] == drill["rollback"]["seconds"]
    assert drill["server"]["exit_code"] == 0


def test_a_second_bundle_is_drilled_against_the_first_and_compared_with_it(gated: Gated) -> None:
    report, a, b = gated.second, gated.pair.a, gated.pair.b
    assert report.passed and [step.name for step in report.steps] == STEPS
    drill = report.step("drill").figures
    assert drill["first_deployment"] is False and drill["previous_bundle_id"] == a.id
    assert drill["promote"]["to"] == b.id == drill["repromote"]["to"]
    assert drill["rollback"]["to"] == a.id
    # Every phase checked its bundle's own goldens over HTTP.
    for phase in ("promote", "rollback", "repromote"):
        assert drill[phase]["goldens"] == {"checked": 5, "matching": 5, "mismatches": []}, phase
    assert drill["traffic"]["failed_requests"] == 0 and drill["traffic"]["expected_no_deployment"] == 0
    status = Deployments(gated.home).status()
    assert status["current"]["bundle_id"] == b.id and status["stack"] == [a.id]
    assert [(e["sequence"], e["from"], e["to"], e["dagster_run_id"]) for e in status["history"]] == [
        (1, None, a.id, "run-a"),
        (2, a.id, b.id, "run-b"),
    ]


def test_the_drill_uses_its_own_pointer_and_never_touches_production(gated: Gated) -> None:
    a, b = gated.pair.a.id, gated.pair.b.id
    for report, sequence in ((gated.first, 0), (gated.second, 1)):
        drill = report.step("drill").figures
        assert drill["pointer"] == DRILL_POINTER == "drill"
        assert drill["production_before"] == drill["production_after"]
        assert drill["production_before"]["sequence"] == sequence
    events = Deployments(gated.home, DRILL_POINTER).history()
    assert [(e["action"], e["to"]) for e in events] == [
        ("promote", a),
        ("rollback", None),
        ("promote", a),
        ("promote", b),
        ("rollback", a),
        ("promote", b),
    ]
    assert replay(events) == (b, [a])
    assert all(e["pointer"] == "drill" and e["actor"] == "gate-test" for e in events)
    # Production's history holds the two promotions and nothing the drills did.
    assert [e["action"] for e in Deployments(gated.home).history()] == ["promote", "promote"]


def test_a_gate_that_fails_at_stress_leaves_production_serving(gated: Gated) -> None:
    production, drill = Deployments(gated.home), Deployments(gated.home, DRILL_POINTER)
    before, drill_before = production.status(), drill.status()
    # busy_cores_limit beyond any machine: a failure however busy it is (test_inconclusive.py: the other way).
    impossible = with_gate(load_config(TINY_CONFIG), slo_ttft_p99_ms=0.001, busy_cores_limit=1000.0)
    with pytest.raises(GateFailed) as failed:
        run_gate(gated.home, impossible, gated.pair.a.id, run_id="run-impossible")
    exc = failed.value
    assert (exc.step, exc.figure, exc.limit) == ("stress", "concurrency=1.ttft_ms.p99", 0.001)
    assert exc.value > 0.001
    assert str(exc).startswith("gate failed at stress: concurrency=1.ttft_ms.p99 = ")
    assert "above gate.slo_ttft_p99_ms" in str(exc)
    report = exc.report
    assert report is not None and not report.passed
    assert [(s.name, s.passed) for s in report.steps] == [
        ("verify", True),
        ("quality", True),
        ("warmup", True),
        ("compare", True),
        ("stress", False),
    ]
    stress = report.step("stress").figures
    assert {v["figure"] for v in stress["violations"]} == {f"{level}.ttft_ms.p99" for level in LEVELS}
    assert stress["server"]["exit_code"] == 0
    assert stress["outcome"] == "failed" and stress["levels"]["poisson=8"]["others_cores"] >= 0
    on_disk = read_report(Path(report.path))
    assert on_disk["failure"]["figure"] == "concurrency=1.ttft_ms.p99" and on_disk["passed"] is False
    assert on_disk["outcome"] == on_disk["failure"]["outcome"] == "failed"
    assert on_disk["steps"][4]["figures"]["levels"].keys() == LEVELS
    # Production and the drill pointer are exactly as they were.
    assert production.status() == before and drill.status() == drill_before


def test_production_already_serving_the_bundle_is_not_gated(gated: Gated) -> None:
    with pytest.raises(DeploymentError, match="production already serves serving_bundle .* nothing to gate"):
        run_gate(gated.home, load_config(TINY_CONFIG), gated.pair.b.id)


def test_a_tampered_bundle_fails_at_verify(pair: BundlePair, tmp_path: Path) -> None:
    home = home_with_bundles(tmp_path / "home", pair)
    production = Deployments(home)
    tokenizer = production.store.get("serving_bundle", pair.b.id).path / "tokenizer.json"
    tokenizer.write_bytes(tokenizer.read_bytes() + b" ")
    with pytest.raises(GateFailed) as failed:
        run_gate(home, load_config(TINY_CONFIG), pair.b.id)
    exc = failed.value
    assert (exc.step, exc.figure, exc.value, exc.limit) == ("verify", "problems", 1, 0)
    assert f"{tokenizer}: sha256 does not match the manifest" in exc.reason
    assert exc.report is not None and [s.name for s in exc.report.steps] == ["verify"]
    assert production.status()["history"] == [] and production.current()["bundle_id"] is None
    assert not Deployments(home, DRILL_POINTER).directory.exists()
    assert read_report(Path(exc.report.path))["failure"]["step"] == "verify"


def test_gate_reports_keep_every_run(gated: Gated) -> None:
    names = sorted(path.name for path in reports_dir(gated.home).glob("*.json"))
    assert any(name.startswith(gated.pair.a.id) and name.endswith("-run-a.json") for name in names)
    assert any(name.startswith(gated.pair.b.id) and name.endswith("-run-b.json") for name in names)
    folder = Path(gated.first.path).with_suffix("")
    assert {p.name for p in folder.iterdir()} >= {"config.yaml", "stress-server.log", "drill-server.log"}
    second = {p.name for p in Path(gated.second.path).with_suffix("").iterdir()}
    assert second >= {f"compare-round{n}-{side}.log" for n in (1, 2) for side in ("candidate", "deployed")}
    assert load_config(folder / "config.yaml") == load_config(TINY_CONFIG)
    assert json.loads(Path(gated.second.path).read_text())["passed"] is True

"""Measure the error rates of the gate's decisions beside busy processes.

    .venv/bin/python scripts/gate_error_rates.py --home H --candidate A --deployed B \\
        --runs 20 --hogs 1 --json results.json
    .venv/bin/python scripts/gate_error_rates.py --home H --step stress --candidate A \\
        --runs 20 --hogs 1 --json results.json

`--step compare` (the default) runs the gate's compare step (gate/compare.py,
speed_statistics.py) `--runs` times with candidate A against deployed bundle B (both in the
store of home H), with `--hogs` processes spinning on the CPU beside it the whole time (a busy
machine), and reports how many runs passed: A == B measures the false-failure rate (every
failure is one), a slower A (the same data, twice the layers) the missed-regression rate
(every pass is one).

`--step stress` runs the stress step (gate/stress.py) on A `--runs` times beside the hogs and
counts passed, failed and inconclusive (gate/busy.py: an SLO broken only while other processes
took at least gate.busy_cores_limit of the cores): on a good bundle every failure is a false
one, and an inconclusive run is no refusal (a re-run can pass). `--hogs 0` measures the quiet
machine.

The settings are the config's (`--config`, default configs/pipeline.yaml: the demo's). One JSON
document on stdout (and in `--json`); each run's line on stderr as it ends.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aieng_core.config import AiengConfig, load_config  # noqa: E402
from aieng_core.gate.compare import compare_step  # noqa: E402
from aieng_core.gate.report import GateFailed  # noqa: E402
from aieng_core.gate.server_env import write_config  # noqa: E402
from aieng_core.gate.stress import stress_step  # noqa: E402
from aieng_core.store import ArtifactStore  # noqa: E402

COMPARE_SETTINGS = (
    "compare_rounds",
    "compare_max_rounds",
    "compare_requests",
    "compare_concurrency",
    "compare_confidence",
    "max_regression",
)
STRESS_SETTINGS = (
    "concurrencies",
    "poisson_rates",
    "requests_per_level",
    "max_new_tokens",
    "max_seconds_per_level",
    "slo_ttft_p99_ms",
    "slo_e2el_p99_ms",
    "slo_ttft_ms",
    "slo_tpot_ms",
    "goodput_floor",
    "busy_cores_limit",
)


def _spin() -> None:
    while True:
        pass


def _compare_run(figures: dict[str, Any]) -> dict[str, Any]:
    decision = figures.get("decision") or {}
    return {
        "ratio": decision.get("ratio"),
        "interval": decision.get("interval"),
        "others_cores": [turn["others_cores"] for turn in figures.get("turns", []) if turn["side"] == "candidate"],
    }


def _stress_run(figures: dict[str, Any]) -> dict[str, Any]:
    return {
        "violations": [v["figure"] for v in figures.get("violations", [])],
        "others_cores": {name: level["others_cores"] for name, level in figures.get("levels", {}).items()},
        "step_others_cores": figures.get("cpu", {}).get("others_cores"),
    }


def _summary(step: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    if step == "stress":
        outcomes = [run["outcome"] for run in runs]
        return {outcome: outcomes.count(outcome) for outcome in ("passed", "failed", "inconclusive")}
    ratios = [run["ratio"] for run in runs if run["ratio"] is not None]
    return {
        "passed": sum(1 for run in runs if run["outcome"] == "passed"),
        "ratio_median": statistics.median(ratios) if ratios else None,
        "ratio_min": min(ratios) if ratios else None,
        "ratio_max": max(ratios) if ratios else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--home", required=True, type=Path)
    parser.add_argument("--config", default="configs/pipeline.yaml", type=Path)
    parser.add_argument("--step", choices=("compare", "stress"), default="compare", help="the gate step to measure")
    parser.add_argument("--candidate", required=True, help="serving_bundle id")
    parser.add_argument("--deployed", help="serving_bundle id (--step compare)")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--hogs", type=int, default=1, help="CPU-spinning processes beside the step")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    if args.step == "compare" and args.deployed is None:
        parser.error("--step compare needs --deployed")

    config = load_config(args.config)
    store = ArtifactStore(args.home)
    candidate = store.get("serving_bundle", args.candidate).path
    hogs = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.hogs)]
    for hog in hogs:
        hog.start()
    runs: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="gate-error-rates-") as scratch:
            work = Path(scratch)
            config_path = write_config(config, work / "config.yaml")
            step: Callable[[], dict[str, Any]] = (
                partial(stress_step, args.home, candidate, config, config_path, work)
                if args.step == "stress"
                else partial(compare_step, args.home, candidate, store, args.deployed, config, config_path, work)
            )
            for number in range(args.runs):
                runs.append({"run": number + 1, **_measure(step, args.step)})
                print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    finally:
        for hog in hogs:
            hog.kill()
    result = {
        "step": args.step,
        "candidate": args.candidate,
        "deployed": args.deployed,
        "same_bundle": args.candidate == args.deployed,
        "hogs": args.hogs,
        "settings": _settings(config, STRESS_SETTINGS if args.step == "stress" else COMPARE_SETTINGS),
        "runs": len(runs),
        **_summary(args.step, runs),
        "seconds_per_run_median": statistics.median(run["seconds"] for run in runs) if runs else None,
        "detail": runs,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n", encoding="utf-8")
    return 0


def _measure(step: Callable[[], dict[str, Any]], name: str) -> dict[str, Any]:
    """One run of the step: its outcome (passed, failed, inconclusive), the failure, its figures' gist."""
    started = time.perf_counter()
    try:
        figures, outcome, message = step(), "passed", None
    except GateFailed as exc:
        figures, outcome, message = exc.figures, exc.outcome, str(exc)
    gist = _stress_run(figures) if name == "stress" else _compare_run(figures)
    return {"outcome": outcome, "message": message, **gist, "seconds": time.perf_counter() - started}


def _settings(config: AiengConfig, keys: tuple[str, ...]) -> dict[str, Any]:
    return {key: getattr(config.gate, key) for key in keys}


if __name__ == "__main__":
    raise SystemExit(main())

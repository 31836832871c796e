"""Measure the error rates of the gate's speed decision (gate/compare.py, speed_statistics.py).

    .venv/bin/python scripts/gate_error_rates.py --home H --candidate A --deployed B \\
        --runs 20 --hogs 1 --json results.json

runs the gate's compare step `--runs` times with candidate A against deployed bundle B (both
in the store of home H), with `--hogs` processes spinning on the CPU beside it the whole
time (a busy machine), and reports how many runs passed: A == B measures the false-failure
rate (every failure is one), a slower A (the same data, twice the layers) the missed-
regression rate (every pass is one). The settings are the config's (`--config`, default
configs/pipeline.yaml: the demo's). One JSON document on stdout (and in `--json`).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from aieng_core.config import load_config  # noqa: E402
from aieng_core.gate.compare import compare_step  # noqa: E402
from aieng_core.gate.report import GateFailed  # noqa: E402
from aieng_core.gate.server_env import write_config  # noqa: E402
from aieng_core.store import ArtifactStore  # noqa: E402


def _spin() -> None:
    while True:
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--home", required=True, type=Path)
    parser.add_argument("--config", default="configs/pipeline.yaml", type=Path)
    parser.add_argument("--candidate", required=True, help="serving_bundle id")
    parser.add_argument("--deployed", required=True, help="serving_bundle id")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--hogs", type=int, default=1, help="CPU-spinning processes beside the comparison")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)

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
            for number in range(args.runs):
                started = time.perf_counter()
                try:
                    figures = compare_step(args.home, candidate, store, args.deployed, config, config_path, work)
                    passed = True
                except GateFailed as exc:
                    figures, passed = exc.figures, False
                decision = figures.get("decision") or {}
                runs.append(
                    {
                        "run": number + 1,
                        "passed": passed,
                        "ratio": decision.get("ratio"),
                        "interval": decision.get("interval"),
                        "seconds": time.perf_counter() - started,
                    }
                )
                print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    finally:
        for hog in hogs:
            hog.kill()
    ratios = [run["ratio"] for run in runs if run["ratio"] is not None]
    result = {
        "candidate": args.candidate,
        "deployed": args.deployed,
        "same_bundle": args.candidate == args.deployed,
        "hogs": args.hogs,
        "settings": {
            key: getattr(config.gate, key)
            for key in (
                "compare_rounds",
                "compare_max_rounds",
                "compare_requests",
                "compare_concurrency",
                "compare_confidence",
                "max_regression",
            )
        },
        "runs": len(runs),
        "passed": sum(1 for run in runs if run["passed"]),
        "ratio_median": statistics.median(ratios) if ratios else None,
        "ratio_min": min(ratios) if ratios else None,
        "ratio_max": max(ratios) if ratios else None,
        "seconds_per_run_median": statistics.median(run["seconds"] for run in runs) if runs else None,
        "detail": runs,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""`aieng bench serving`: our serving engine against transformers and CTranslate2, same work.

Same weights: the configured model shape (configs/pipeline.yaml: 3.95M parameters), randomly
initialised with a fixed seed and saved once as safetensors, which transformers, CTranslate2
(converted from that directory) and our engine all load. Same prompts: real demo text cut to
mixed lengths, given to every in-process peer as the same token ids and to the server as text
that encodes to exactly those ids. Same outputs: every engine generates exactly the planned
number of tokens (EOS ignored) and reports what it got. 2 threads everywhere (1 in the quick run).

Each peer runs in a fresh process of its own (serving_workers.py), the order of the peers
alternated from round to round, each workload warmed up before it is timed; every figure is
the median of the rounds with their spread (min..max). The CTranslate2 conversion runs in a
process of its own first, never in a measuring one.

Figures (goals from issue 8): (1) single-stream tokens/s, ours vs transformers `generate`;
(2) ours vs CTranslate2 at batch 1/16/64; (3) 16 concurrent HTTP clients against a real
`aieng serve` with mixed output lengths vs transformers one request at a time, transformers'
static batching and CTranslate2's in-process batch; (4) serving metrics (TTFT, TPOT, ITL,
E2EL, throughput, goodput; aieng_core/loadgen/stats.py) at several concurrencies and Poisson rates;
(5) achieved FLOP/s at batch 64 as a fraction of this machine's torch.matmul peak; (6) the
contention workload (issue 39, serving_contention.py): the server, its spin-waiting baseline
and CTranslate2 alone and beside one busy process, in rounds of their own. A profile of our
decode step (serving_profile.py) says what bounds each figure.

The config comes from `config`, else $AIENG_CONFIG, else configs/pipeline.yaml; `quick`
shrinks every workload (one round, a few tokens) for a seconds-fast smoke test.

This module runs the suite and is every worker's entry point (`--worker NAME PLAN`); the parts
live beside it: serving_plan.py (the sizes, the weights, the bundle and the prompts: the plan),
serving_rounds.py (worker processes, the alternated order), serving_report.py (rounds into
medians, spreads, goals and bounds) and serving_format.py (the text output).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from aieng_core.bench.serving_format import format_serving_results
from aieng_core.bench.serving_plan import CONTENTION_PEERS, FULL, PEERS, QUICK, SEED, prepare
from aieng_core.bench.serving_report import GOALS, build_report, contention_figures
from aieng_core.bench.serving_rounds import run_rounds, run_worker
from aieng_core.config import load_config, resolve_config_path
from aieng_core.output import write_results

__all__ = ["GOALS", "format_serving_results", "main", "run_serving_bench"]


WORKLOADS = ("all", "contention")


def run_serving_bench(
    out: str | None = None, config: str | None = None, quick: bool = False, rounds: int = 3, workload: str = "all"
) -> dict[str, Any]:
    """Every workload, or with `workload` "contention" only the contention workload (its own
    goals; the CTranslate2 conversion it needs runs first all the same)."""
    if rounds < 1:
        raise ValueError("rounds must be at least 1")
    if workload not in WORKLOADS:
        raise ValueError(f"workload {workload!r}: choose one of {', '.join(WORKLOADS)}")
    import torch

    settings = load_config(config)
    config_path = resolve_config_path(config)
    sizes = QUICK if quick else FULL
    rounds = 1 if quick else rounds
    started = dt.datetime.now(dt.UTC)
    load_at_start = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="aieng-serving-bench-"))
    try:
        plan = prepare(work, settings, sizes)
        plan_path = work / "plan.json"
        plan_path.write_text(json.dumps(plan), encoding="utf-8")
        env = {**os.environ, **plan["server_env"]}

        def worker(name: str) -> dict[str, Any]:
            return run_worker(name, plan_path, env, sizes.worker_timeout_s)

        conversion = worker("convert")
        if workload == "contention":
            contention_records = run_rounds(CONTENTION_PEERS, rounds, worker)
            figures, goals = contention_figures(plan, contention_records)
            return _contention_results(
                out, quick, started, rounds, sizes, plan, conversion, figures, goals, contention_records
            )
        round_records = run_rounds(PEERS, rounds, worker)
        contention_records = run_rounds(CONTENTION_PEERS, rounds, worker)
        profile = worker("profile")
        report = build_report(plan, round_records, profile, contention_records)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    results: dict[str, Any] = {
        "suite": "serving",
        "quick": quick,
        "created_at": started.isoformat(timespec="seconds"),
        "seconds": (dt.datetime.now(dt.UTC) - started).total_seconds(),
        "config_file": str(config_path),
        "machine": {
            "cpus": os.cpu_count(),
            "threads": sizes.threads,
            "torch_threads_per_peer": {
                peer: [record[peer].get("threads") for record in round_records] for peer in PEERS if peer != "http"
            },
            "load_average_at_start": list(load_at_start),
            "load_average_at_end": list(os.getloadavg()),
            "load_average_1min_at_each_run": [
                {"round": record["round"], **{peer: record[peer]["load_average_1min"] for peer in record["order"]}}
                for record in round_records
            ],
            "python": platform.python_version(),
            "platform": platform.platform(),
            "torch": torch.__version__,
            "transformers": _version("transformers"),
            "ctranslate2": _version("ctranslate2"),
        },
        "method": {
            "peers": "each in a fresh process; order alternated each round; warmed up before timing; "
            "median and spread (min..max) of the rounds",
            "rounds": rounds,
            "orders": [record["order"] for record in round_records],
            "same_work": f"same safetensors weights (random init, seed {SEED}), same prompt token ids, every engine "
            "generates exactly the planned tokens (ours ignore_eos, transformers without EOS token, CTranslate2 "
            "min_length = max_length)",
            "threads": f"{sizes.threads} per process: torch.set_num_threads, CTranslate2 intra_threads, "
            "OMP_NUM_THREADS, serving.threads",
            "ctranslate2_conversion": {**conversion, "process": "its own, before any measurement"},
            "sizes": asdict(sizes),
        },
        "model": {"parameters": plan["parameters"], "config": plan["model_config"], "bundle_id": plan["bundle_id"]},
        "engine_limits": plan["limits"],
        **report,
        "profile": profile,
        "rounds": round_records,
        "contention_rounds": contention_records,
    }
    write_results(out, results)
    return results


def _contention_results(
    out: str | None,
    quick: bool,
    started: dt.datetime,
    rounds: int,
    sizes: Any,
    plan: dict[str, Any],
    conversion: dict[str, Any],
    contention: dict[str, Any],
    goals: dict[str, Any],
    records: list[dict[str, Any]],
) -> dict[str, Any]:
    """`--workload contention`'s results: the contention section and its goals alone."""
    results: dict[str, Any] = {
        "suite": "serving",
        "workload": "contention",
        "quick": quick,
        "created_at": started.isoformat(timespec="seconds"),
        "seconds": (dt.datetime.now(dt.UTC) - started).total_seconds(),
        "machine": {"cpus": os.cpu_count(), "threads": sizes.threads, "load_average_at_end": list(os.getloadavg())},
        "method": {
            "peers": "each in a fresh process; order alternated each round; median and spread (min..max)",
            "rounds": rounds,
            "orders": [record["order"] for record in records],
            "ctranslate2_conversion": {**conversion, "process": "its own, before any measurement"},
        },
        "model": {"parameters": plan["parameters"], "config": plan["model_config"], "bundle_id": plan["bundle_id"]},
        "figures": {"contention": contention},
        "goals": goals,
        "bounds": [],
        "contention_rounds": records,
    }
    write_results(out, results)
    return results


def _version(module: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(module)
    except PackageNotFoundError:
        return None


# ---- worker entry point -----------------------------------------------------------------------
def _workers() -> dict[str, Callable[[dict[str, Any]], dict[str, Any]]]:
    from aieng_core.bench import serving_contention, serving_profile, serving_workers

    return {
        "convert": serving_workers.convert,
        "ours": serving_workers.ours,
        "transformers": serving_workers.transformers_peer,
        "ctranslate2": serving_workers.ctranslate2_peer,
        "ours_int8": serving_workers.ours_int8,
        "ctranslate2_int8": serving_workers.ctranslate2_int8,
        "http": serving_workers.http,
        "profile": serving_profile.profile,
        **serving_contention.contention_workers(),
    }


def main(argv: list[str] | None = None) -> int:
    """One worker of the serving benchmark (run by run_serving_bench in a fresh process)."""
    parser = argparse.ArgumentParser(prog="python -m aieng_core.bench.serving_bench")
    parser.add_argument("--worker", required=True, choices=("convert", *PEERS, *CONTENTION_PEERS, "profile"))
    parser.add_argument("plan", type=Path, help="plan.json written by run_serving_bench")
    args = parser.parse_args(argv)
    plan = json.loads(args.plan.read_text(encoding="utf-8"))
    print(json.dumps(_workers()[args.worker](plan)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

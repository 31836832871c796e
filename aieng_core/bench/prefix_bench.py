"""`aieng bench prefix`: time to first token with and without prefix caching, for requests that
share a 128-token system prompt, and the hit rate the cache reached.

Same weights and engine limits as `aieng bench serving` (serving_plan.py: the configured model
shape, random init, the pipeline bundle's limits); the peers are our engine with
`serving.prefix_cache_tokens` 0 ("off") and its default ("on"), each in a fresh process of
its own, the order alternated from round to round, each warmed up before it is timed. Same
work: the same prompts (a system prompt of 128 tokens of demo text, then a different user
text of 16 to 40 tokens each), greedy, the same number of tokens; the report says whether
both peers generated the same tokens, which the cache must not change.

Two workloads, in the engine (no HTTP: the server adds the same to both):
- sequential: the requests one at a time on an idle engine, one token each; TTFT is then the
  prefill of that prompt. The first request of a run finds the cache cold; the figure is the
  median of the others.
- burst: then as many other requests (the same system prompt, other user texts) at once, 8
  tokens each, as a busy server receives them; TTFT includes the wait for the requests ahead
  in the queue and the prefill budget per step.
What a workload can reuse is the shared system prompt only (every user text is another
document's); each hit rate is of that workload's prompt tokens, the first request's included.

Decode steps run eagerly (no captured graphs): TTFT is prefill work, and capturing would cost
each fresh process a minute for nothing measured here.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from aieng_core.bench.serving_plan import FULL, QUICK, prepare, prompts_of_lengths
from aieng_core.bench.serving_report import spread_tree
from aieng_core.bench.serving_rounds import run_rounds, run_worker
from aieng_core.config import load_config, resolve_config_path
from aieng_core.output import write_results

SYSTEM_TOKENS = 128
USER_TOKENS = (16, 24, 32, 40)
BURST_NEW_TOKENS = 8
PEERS = ("off", "on")


def run_prefix_bench(
    out: str | None = None, config: str | None = None, quick: bool = False, rounds: int = 3
) -> dict[str, Any]:
    if rounds < 1:
        raise ValueError("rounds must be at least 1")
    settings = load_config(config)
    sizes = replace(QUICK if quick else FULL, worker_timeout_s=600)
    rounds = 1 if quick else rounds
    requests = 4 if quick else 16
    started = dt.datetime.now(dt.UTC)
    work = Path(tempfile.mkdtemp(prefix="aieng-prefix-bench-"))
    try:
        plan = prepare(work, settings, sizes)
        from aieng_core.tokenizer.bpe import load_tokenizer

        tokenizer = load_tokenizer(Path(plan["model_dir"]))
        # The pipeline's context (256) holds them all; a smaller one (a test's) gets shorter ones.
        context = plan["limits"]["max_context"]
        system_tokens = min(SYSTEM_TOKENS, context // 2)
        user_tokens = [
            min(USER_TOKENS[i % len(USER_TOKENS)], context - system_tokens - BURST_NEW_TOKENS) for i in range(requests)
        ]
        [system] = prompts_of_lengths(tokenizer, [system_tokens], plan["eos_token_id"])
        # Two sets of user texts, from other demo documents each: one per workload.
        users = prompts_of_lengths(tokenizer, user_tokens * 2, plan["eos_token_id"], skip=1)
        plan["prefix_prompts"] = [system["ids"] + user["ids"] for user in users[:requests]]
        plan["prefix_burst_prompts"] = [system["ids"] + user["ids"] for user in users[requests:]]
        plan["prefix_cache_tokens"] = settings.serving.prefix_cache_tokens
        plan_path = work / "plan.json"
        plan_path.write_text(json.dumps(plan), encoding="utf-8")
        env = {**os.environ, "OMP_NUM_THREADS": str(sizes.threads)}

        def worker(name: str) -> dict[str, Any]:
            return run_worker(name, plan_path, env, sizes.worker_timeout_s, module="aieng_core.bench.prefix_bench")

        records = run_rounds(PEERS, rounds, worker)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    figures = {peer: spread_tree([record[peer]["workloads"] for record in records]) for peer in PEERS}
    same = all(record["off"]["digest"] == record["on"]["digest"] for record in records)
    results: dict[str, Any] = {
        "suite": "prefix",
        "quick": quick,
        "created_at": started.isoformat(timespec="seconds"),
        "seconds": (dt.datetime.now(dt.UTC) - started).total_seconds(),
        "config_file": str(resolve_config_path(config)),
        "method": {
            "peers": "our engine with serving.prefix_cache_tokens 0 (off) and "
            f"{plan['prefix_cache_tokens']} (on), each in a fresh process, order alternated each round, warmed up "
            "first; median and spread (min..max) of the rounds",
            "rounds": rounds,
            "orders": [record["order"] for record in records],
            "threads": sizes.threads,
            "prompts": f"{requests} prompts: a {system_tokens}-token system prompt, then {sorted(set(user_tokens))} "
            "tokens of other demo texts",
            "same_work": "the same prompt token ids, greedy, the same token counts",
        },
        "model": {"parameters": plan["parameters"], "bundle_id": plan["bundle_id"]},
        "engine_limits": plan["limits"],
        "figures": figures,
        "ttft_speedup": {
            workload: figures["off"][workload]["ttft_ms_median"]["median"]
            / figures["on"][workload]["ttft_ms_median"]["median"]
            for workload in ("sequential", "burst")
        },
        "hit_rate": {w: figures["on"][w]["hit_rate"]["median"] for w in ("sequential", "burst")},
        "same_tokens_with_and_without": same,
        "rounds": records,
    }
    write_results(out, results)
    return results


def format_prefix_results(results: dict[str, Any]) -> str:
    figures = results["figures"]
    lines = [f"prefix caching, {results['method']['prompts']} ({results['method']['rounds']} rounds)"]
    for workload in ("sequential", "burst"):
        off, on = (figures[p][workload]["ttft_ms_median"] for p in PEERS)
        lines.append(
            f"  {workload:<10} TTFT median: off {off['median']:.2f} ms ({off['min']:.2f}..{off['max']:.2f}), "
            f"on {on['median']:.2f} ms ({on['min']:.2f}..{on['max']:.2f}): {results['ttft_speedup'][workload]:.2f}x"
        )
    rates = results["hit_rate"]
    lines.append(f"  hit rate (on): sequential {rates['sequential']:.3f}, burst {rates['burst']:.3f}")
    lines.append(f"  same tokens with and without: {results['same_tokens_with_and_without']}")
    return "\n".join(lines)


# ---- workers --------------------------------------------------------------------------------------
def measure(plan: dict[str, Any], prefix_cache_tokens: int) -> dict[str, Any]:
    import hashlib

    import torch

    from aieng_core.bench.serving_workers import load_engine
    from aieng_core.serving.request import SamplingParams

    torch.set_num_threads(plan["threads"])
    torch.set_grad_enabled(False)
    engine = load_engine(plan, prefix_cache_tokens=prefix_cache_tokens, step_graphs="eager")
    engine.warmup(plan["warmup_prompt_lengths"])
    prompts = plan["prefix_prompts"]
    # Warm the prefill of these very shapes, then start from an empty cache.
    engine.generate([*prompts, *plan["prefix_burst_prompts"]], SamplingParams(max_new_tokens=1))
    engine.prefix_cache.clear()

    stats = engine.prefix_cache.stats
    counted = [0, 0]  # (queried, hit) tokens before the workload

    def ttft(outputs: list[Any]) -> dict[str, float]:
        values = sorted(1000 * (o.ttft_seconds or 0.0) for o in outputs)
        return {"ttft_ms_median": statistics.median(values), "ttft_ms_max": values[-1]}

    def cache_counts() -> dict[str, float]:
        """The cache's counts over the workload just run."""
        queried, hit = stats.queried - counted[0], stats.hit - counted[1]
        counted[:] = [stats.queried, stats.hit]
        return {"hit_rate": hit / queried if queried else 0.0, "prompt_tokens": queried, "hit_tokens": hit}

    one = SamplingParams(max_new_tokens=1)
    sequential = [engine.generate([prompt], one)[0] for prompt in prompts]
    first = 1000 * (sequential[0].ttft_seconds or 0.0)  # the cold cache's
    workloads = {"sequential": {**ttft(sequential[1:]), "first_ttft_ms": first, **cache_counts()}}
    burst_params = SamplingParams(max_new_tokens=BURST_NEW_TOKENS, ignore_eos=True)
    burst = engine.generate(plan["prefix_burst_prompts"], burst_params)
    workloads["burst"] = {**ttft(burst), **cache_counts()}
    tokens = [list(o.token_ids) for o in (*sequential, *burst)]
    return {
        "pid": os.getpid(),
        "load_average_1min": os.getloadavg()[0],
        "workloads": workloads,
        "digest": hashlib.sha256(json.dumps(tokens).encode()).hexdigest(),
    }


def main(argv: list[str] | None = None) -> int:
    """One worker of the prefix benchmark (run by run_prefix_bench in a fresh process)."""
    parser = argparse.ArgumentParser(prog="python -m aieng_core.bench.prefix_bench")
    parser.add_argument("--worker", required=True, choices=PEERS)
    parser.add_argument("plan", type=Path)
    args = parser.parse_args(argv)
    plan = json.loads(args.plan.read_text(encoding="utf-8"))
    print(json.dumps(measure(plan, plan["prefix_cache_tokens"] if args.worker == "on" else 0)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

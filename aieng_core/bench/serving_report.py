"""The serving benchmark's report: rounds of worker results into figures (the median of the
rounds with their spread, min..max), goals (ratios of medians against their targets) and the
bounds that say what limits each missed goal (from the profile of our decode step). The
contention workload's rounds (serving_contention.py) make a section of their own.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence
from typing import Any

from aieng_core.bench.serving_plan import SLO_MS
from aieng_core.loadgen.stats import METRIC_DEFINITIONS

GOALS = {
    "single_stream_vs_transformers": 3.0,
    "batch_1_vs_ctranslate2": 0.5,
    "batch_16_vs_ctranslate2": 0.8,
    "batch_64_vs_ctranslate2": 1.1,
    "http_16_clients_vs_transformers_sequential": 8.0,
    "http_16_clients_vs_transformers_static_batch": 2.0,
    "http_16_clients_vs_ctranslate2_batch": 0.8,
    "flops_fraction_of_matmul_peak_at_batch_64": 0.4,
    # The server keeps the engine's speed: HTTP over in-process, the worse of streamed and not.
    "http_1_client_vs_in_process": 0.9,
    "http_64_clients_vs_in_process": 0.9,
    # bundle.weights int8: our int8 variant against CTranslate2's int8, same weights, batch 64.
    "int8_batch_64_vs_ctranslate2_int8": 1.0,
    # Issue 39, the contention workload: our server beside one busy process against the same
    # server alone, and alone against the spin-waiting build it replaced (serving.adapt_threads off).
    "contention_16_clients_busy_vs_alone": 0.5,
    "contention_single_stream_busy_vs_alone": 0.4,
    "contention_16_clients_alone_vs_spin_waiting_baseline": 0.95,
    # At most: beside the busy process, the first round of 16 clients after ready over the third.
    "contention_first_round_over_third_busy": 1.5,
}
# Goals met at or below their target; every other goal is met at or above it.
AT_MOST_GOALS = frozenset({"contention_first_round_over_third_busy"})


def spread(values: Sequence[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "rounds": list(values)}


def spread_tree(trees: Sequence[Any]) -> Any:
    """Numbers -> their spread over the rounds; dicts recursively; anything else from round 0."""
    first = trees[0]
    if isinstance(first, bool) or first is None or isinstance(first, (str, list)):
        return first
    if isinstance(first, (int, float)):
        return spread([float(t) for t in trees])
    return {key: spread_tree([t[key] for t in trees]) for key in first}


def peer_figure(rounds: list[dict[str, Any]], peer: str, workload: str, key: str = "tokens_per_second") -> dict:
    runs = [record[peer]["workloads"][workload] for record in rounds]
    figure = spread([run[key] for run in runs])
    figure["tokens"] = runs[0]["tokens"]
    if any(run["tokens"] != figure["tokens"] for run in runs):
        raise RuntimeError(f"{peer} {workload}: token counts differ between rounds")
    return figure


def _identical(rounds: list[dict[str, Any]], workload: str, peer: str) -> str:
    ours = rounds[0]["ours"]["workloads"][workload]["digests"]
    theirs = rounds[0][peer]["workloads"][workload]["digests"]
    return f"{sum(a == b for a, b in zip(ours, theirs))}/{len(ours)}"


def step_graph_figures(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Our decode step per batch bucket, captured versus eager, timed in the same process by
    each round's warmup (step_graphs.py): the spread of each over the rounds; a bucket not
    captured in round 0 is listed with its reason."""
    warmups = [record["ours"].get("engine_warmup", {}).get("step_graphs") for record in rounds]
    if not all(warmups):
        return {"status": "not reported by the ours worker"}
    first = warmups[0]
    buckets: dict[str, Any] = {}
    for index, bucket in enumerate(first["buckets"]):
        if not all(w["buckets"][index]["captured"] for w in warmups):
            buckets[str(bucket["batch"])] = {"captured": False, "reason": bucket.get("reason", "not in every round")}
            continue
        per_round = [w["buckets"][index] for w in warmups]
        buckets[str(bucket["batch"])] = {
            "captured": True,
            **{key: spread([b[key] for b in per_round]) for key in ("eager_step_ms", "captured_step_ms", "speedup")},
            "capture_seconds": spread([b["capture_seconds"] for b in per_round]),
        }
    return {
        "status": first["status"],
        "method": "one decode step of idle rows per bucket, 10 timed after 1 untimed, eager then captured, "
        "in the ours worker's process during its warmup; round 0 compiles, later rounds load inductor's disk cache",
        "capture_seconds": spread([w["capture_seconds"] for w in warmups]),
        "buckets": buckets,
    }


def http_vs_in_process(plan: dict[str, Any], rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """The server's tokens/s over the engine's in-process tokens/s on the same prompts, in the
    same round: one client in turn against `single_stream`, one client per prompt against the
    largest batch; streamed and not, and the worse of the two (what the goal judges)."""
    if not all("in_process_workloads" in record.get("http", {}) for record in rounds):
        return {}
    largest = max(int(size) for size in plan["batch_prompts"])
    figures: dict[str, Any] = {}
    for goal_name, name, workload in (
        ("http_1_client_vs_in_process", "single_stream", "single_stream"),
        (f"http_{largest}_clients_vs_in_process", "largest_batch", f"batch_{largest}"),
    ):
        per_mode: dict[str, Any] = {}
        ratios: dict[str, list[float]] = {}
        for mode in ("no_stream", "stream"):
            served = [
                record["http"]["in_process_workloads"][f"{name}_{mode}"]["output_throughput"] for record in rounds
            ]
            engine = [record["ours"]["workloads"][workload]["tokens_per_second"] for record in rounds]
            ratios[mode] = [h / e for h, e in zip(served, engine, strict=True)]
            per_mode[mode] = {"http_tokens_per_second": spread(served), "ratio": spread(ratios[mode])}
        figures[goal_name] = {
            "in_process_tokens_per_second": spread(
                [record["ours"]["workloads"][workload]["tokens_per_second"] for record in rounds]
            ),
            **per_mode,
            "worse_ratio": spread([min(a, b) for a, b in zip(ratios["no_stream"], ratios["stream"], strict=True)]),
        }
    return figures


def int8_figures(plan: dict[str, Any], rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Both int8 peers per batch size (1: the single-stream workload), beside our float32 engine,
    with how many requests the int8 variant answered exactly as the float32 engine did."""
    figures: dict[str, Any] = {
        "unit": "generated tokens/s for the whole batch (prefill included); batch 1 = the single-stream figure",
        "method": "ours_int8: the float32 weights quantized in the worker (model/int8_weights.py: weight-only int8 "
        "per output channel, float32 matmuls), steps captured; ctranslate2_int8: compute_type int8 (int8 matmuls) "
        "on the same conversion",
    }
    for size, workload in (("1", "single_stream"), *((size, f"batch_{size}") for size in plan["batch_prompts"])):
        row: dict[str, Any] = {
            peer: peer_figure(rounds, peer, workload) for peer in ("ours_int8", "ctranslate2_int8", "ours")
        }
        row["int8_over_fp32"] = row["ours_int8"]["median"] / row["ours"]["median"]
        row["identical_to_fp32"] = _identical(rounds, workload, "ours_int8")
        figures[size] = row
    return figures


def judged(name: str, ratio: float) -> dict[str, Any]:
    """`ratio` against GOALS[name]: met at or above it (at or below it for AT_MOST_GOALS)."""
    target, at_most = GOALS[name], name in AT_MOST_GOALS
    met = ratio <= target if at_most else ratio >= target
    return {"ratio": ratio, "target": target, "comparison": "<=" if at_most else ">=", "met": met}


def goal(name: str, ours: float, peer: float) -> dict[str, Any]:
    return judged(name, ours / peer)


def _check_tokens(summaries: list[dict[str, Any]], asked: int, what: str) -> None:
    got = [summary["output_tokens"] for summary in summaries]
    if any(tokens != asked for tokens in got):
        raise RuntimeError(f"contention {what}: {got} tokens where {asked} were asked for")


def _served(summaries: list[dict[str, Any]], asked: int, what: str) -> dict[str, Any]:
    """A server workload's tokens/s over the rounds; every round must have got the tokens asked for."""
    _check_tokens(summaries, asked, what)
    return {**spread([summary["output_throughput"] for summary in summaries]), "tokens": asked}


def _busy_over_alone(figures: dict[str, Any], workloads: tuple[str, ...]) -> dict[str, float]:
    return {name: figures["busy"][name]["median"] / figures["alone"][name]["median"] for name in workloads}


def contention_figures(plan: dict[str, Any], rounds: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The contention workload's section and its goals: every figure's median and spread over
    the rounds, each ratio one of medians from this run."""
    mixed_asked = sum(row["max_new_tokens"] for row in plan["mixed"])
    single_asked = sum(row["max_new_tokens"] for row in plan["single_stream_requests"])
    section: dict[str, Any] = {
        "unit": "generated tokens/s (only the tokens each request asked for); round times in seconds",
        "method": "each peer alone and beside one busy process (`python -c 'while True: pass'`, started before the "
        "peer, killed after it), each condition a fresh process, order alternated, median of the rounds. Servers: "
        "right after ready, 3 rounds of the 16 mixed requests (16 clients, not streamed), then after a warmup the "
        "16 clients again (mixed_16_clients) and the single-stream requests from one client, streamed; "
        "baseline = the same server with serving.adapt_threads false. CTranslate2: its batch of the 16 mixed "
        "requests and its single stream, in-process",
        "max_new_tokens": [row["max_new_tokens"] for row in plan["mixed"]],
        "single_stream_max_new_tokens": [row["max_new_tokens"] for row in plan["single_stream_requests"]],
        "servers": plan["contention_servers"],
    }
    for server in ("ours", "baseline"):
        conditions: dict[str, Any] = {}
        for condition in ("alone", "busy"):
            runs = [record[f"contention_{server}_{condition}"] for record in rounds]
            for run in runs:
                _check_tokens(run["first_rounds"], mixed_asked, f"{server} {condition} first rounds")
            first = spread([run["first_rounds"][0]["duration_s"] for run in runs])
            third = spread([run["first_rounds"][2]["duration_s"] for run in runs])
            metrics = [run["metrics_at_end"] for run in runs]
            conditions[condition] = {
                "mixed_16_clients": _served([run["mixed_concurrent"] for run in runs], mixed_asked, server),
                "single_stream": _served([run["single_stream"] for run in runs], single_asked, server),
                "first_round_seconds": first,
                "third_round_seconds": third,
                "first_over_third": first["median"] / third["median"],
                "engine_threads_at_end": spread([m["aieng_engine_threads"] for m in metrics]),
                "other_processes_cores_at_end": spread([m["aieng_cpu_other_processes_cores"] for m in metrics]),
                "ready_seconds": spread([run["ready_seconds"] for run in runs]),
                "load_average_1min": spread([run["load_average_1min"] for run in runs]),
            }
            if condition == "busy":
                conditions[condition]["busy_process_cores"] = spread([run["busy_process_cores"] for run in runs])
        section[server] = {
            **conditions,
            "busy_over_alone": _busy_over_alone(conditions, ("mixed_16_clients", "single_stream")),
        }
    ctranslate2: dict[str, Any] = {
        condition: {
            "mixed_batch_16": peer_figure(rounds, f"contention_ctranslate2_{condition}", "mixed_batch"),
            "single_stream": peer_figure(rounds, f"contention_ctranslate2_{condition}", "single_stream"),
            "load_average_1min": spread(
                [record[f"contention_ctranslate2_{condition}"]["load_average_1min"] for record in rounds]
            ),
        }
        for condition in ("alone", "busy")
    }
    ctranslate2["busy"]["busy_process_cores"] = spread(
        [record["contention_ctranslate2_busy"]["busy_process_cores"] for record in rounds]
    )
    # For comparison only (no goal): what the same busy process costs CTranslate2.
    ctranslate2["busy_over_alone"] = _busy_over_alone(ctranslate2, ("mixed_batch_16", "single_stream"))
    section["ctranslate2"] = ctranslate2
    ours, baseline = section["ours"], section["baseline"]
    goals = {
        "contention_16_clients_busy_vs_alone": judged(
            "contention_16_clients_busy_vs_alone", ours["busy_over_alone"]["mixed_16_clients"]
        ),
        "contention_single_stream_busy_vs_alone": judged(
            "contention_single_stream_busy_vs_alone", ours["busy_over_alone"]["single_stream"]
        ),
        "contention_16_clients_alone_vs_spin_waiting_baseline": goal(
            "contention_16_clients_alone_vs_spin_waiting_baseline",
            ours["alone"]["mixed_16_clients"]["median"],
            baseline["alone"]["mixed_16_clients"]["median"],
        ),
        "contention_first_round_over_third_busy": judged(
            "contention_first_round_over_third_busy", ours["busy"]["first_over_third"]
        ),
    }
    section["goals"] = goals
    return section, goals


def _flops(plan: dict[str, Any], rounds: list[dict[str, Any]], batch: int) -> dict[str, Any]:
    config = plan["model_config"]
    parameters = plan["parameters"]
    prompts = plan["batch_prompts"][str(batch)]
    new = plan["new_tokens"]
    # Attention (QK^T and AV) per generated token: 4 x hidden x layers x positions attended.
    hidden, layers = config["num_attention_heads"] * config["head_dim"], config["num_hidden_layers"]
    attention = sum(4 * hidden * layers * (len(p) + k + 1) for p in prompts for k in range(new))
    achieved, fraction, with_attention, peaks = [], [], [], []
    for record in rounds:
        run = record["ours"]["workloads"][f"batch_{batch}"]
        peak = record["ours"]["matmul"]["peak_gflops"] * 1e9
        flops = 2 * parameters * run["tokens_per_second"]
        achieved.append(flops / 1e9)
        peaks.append(peak / 1e9)
        fraction.append(flops / peak)
        with_attention.append((flops + attention / run["seconds"]) / peak)
    return {
        "formula": "achieved = 2 x parameters x generated tokens/s (batch {batch}, {new} new tokens per request, "
        "wall time including prefill); fraction = achieved / peak, peak = best fp32 torch.matmul GFLOP/s "
        "(2 n^3 / time) over n in {sizes} in the same process".format(batch=batch, new=new, sizes=plan["matmul_sizes"]),
        "parameters": parameters,
        "achieved_gflops": spread(achieved),
        "matmul_peak_gflops": spread(peaks),
        "fraction_of_peak": spread(fraction),
        "with_attention_fraction_of_peak": spread(with_attention),
        "attention_note": "with_attention adds 4 x hidden x layers x attended positions per generated token "
        "(QK^T and AV); prompt (prefill) FLOPs are counted in neither",
        "matmul_gflops_by_size_round_0": rounds[0]["ours"]["matmul"]["gflops_by_size"],
    }


def _bounds(figures: dict[str, Any], goals: dict[str, Any], profile: dict[str, Any], peak: float) -> list[str]:
    notes = []
    batches = profile["batches"]

    def step(size: str) -> str:
        p = batches.get(size, {})
        if not p.get("decode_steps"):
            return f"batch {size}: not profiled"
        operators = p["operators"]
        per_op = {op["name"]: op["self_ms_per_step"] for op in operators["top_operators"]}
        heaviest = ", ".join(f"{name} {ms:.2f} ms" for name, ms in list(per_op.items())[:3])
        return (
            f"batch {size} decode step {p['step_ms']:.2f} ms = model forward {p['forward_ms']:.2f} ms "
            f"({p['forward_share']:.0%}) + sampling {p['sampling_ms']:.2f} ms + scheduler and engine Python "
            f"{p['scheduler_and_python_ms']:.2f} ms; the model's linear layers alone (its weights, F.linear) take "
            f"{p['linear_layers_alone_ms']:.2f} ms, so the forward spends "
            f"{p['forward_ms'] - p['linear_layers_alone_ms']:.2f} ms beyond its matmuls; under torch.profiler a step "
            f"makes {operators['aten_calls_per_step']:.0f} operator calls, {operators['aten_share_of_wall']:.0%} of "
            f"the wall inside them (heaviest per step: {heaviest}); attention over padding "
            f"{p['attention_padding_share']:.0%} of attended positions (one attention over every row up to the "
            f"longest: {p.get('attention_padding_share_one_group', 0.0):.0%}); "
            f"prefill of the batch's {size} prompt(s) took "
            f"{p['prefill_ms_total']:.0f} ms next to {p['decode_steps']} decode steps of {p['step_ms']:.2f} ms"
        )

    params = figures["flops_at_batch_64"]["parameters"]
    ideal_1 = 2 * params / (peak * 1e9) * 1000
    if not goals["single_stream_vs_transformers"]["met"] or not goals["batch_1_vs_ctranslate2"]["met"]:
        one = batches.get("1", {})
        detail = ""
        if one.get("decode_steps"):
            linear, forward = one["linear_layers_alone_ms"], one["forward_ms"]
            detail = (
                f" The arithmetic of one token needs {ideal_1:.3f} ms at the matmul peak, its linear layers alone "
                f"take {linear:.2f} ms ({2 * params / (linear / 1000) / 1e9:.1f} GFLOP/s: matrix-vector products), "
                f"and {forward - linear:.2f} ms of the {forward:.2f} ms forward ({1 - linear / forward:.0%}) "
                "is spent outside those matmuls (the other operators and their dispatch)"
            )
        notes.append(f"single stream: {step('1')}.{detail}")
    for size in ("16", "64"):
        if not goals[f"batch_{size}_vs_ctranslate2"]["met"]:
            notes.append(f"batch {size} vs CTranslate2: {step(size)}")
    http = figures["http_16_clients_mixed"]
    in_process = http["ours_in_process"]["median"]
    over_http = http["ours_http"]["median"]
    if not all(goals[g]["met"] for g in goals if g.startswith("http_")):
        longest, asked = max(http["max_new_tokens"]), sum(http["max_new_tokens"])
        step_1 = batches.get("1", {}).get("step_ms")
        if step_1:
            # The longest request needs `longest` steps one after another, whatever the batching.
            notes.append(
                f"16 HTTP clients: the longest request alone needs {longest} sequential decode steps; at the "
                f"batch-1 step time ({step_1:.2f} ms) that is >= {longest * step_1 / 1000:.2f} s, a ceiling of "
                f"{asked / (longest * step_1 / 1000):,.0f} tok/s for these {asked} tokens in-process"
            )
        notes.append(
            f"16 HTTP clients: {over_http:,.0f} tok/s over HTTP vs {in_process:,.0f} tok/s for the same requests "
            f"in-process ({over_http / in_process:.0%}); the server used {http['server_cpu_seconds']['median']:.1f} "
            f"CPU-s and the load client {http['client_cpu_seconds']['median']:.1f} CPU-s over "
            f"{http['seconds']['median']:.1f} s of wall time on {os.cpu_count()} CPUs"
        )
    if not goals["flops_fraction_of_matmul_peak_at_batch_64"]["met"]:
        big = batches.get("64", {})
        alone = ""
        if big.get("decode_steps"):
            linear_gflops = 2 * params * 64 / (big["linear_layers_alone_ms"] / 1000) / 1e9
            alone = (
                f" The linear layers alone, with no overhead at all, reach {linear_gflops:.1f} GFLOP/s "
                f"({linear_gflops / peak:.0%} of the peak): decode products are (64 x 256) by (256 x n), thin "
                "shapes next to the square products of the peak"
            )
        notes.append(
            f"FLOP/s at batch 64: {figures['flops_at_batch_64']['achieved_gflops']['median']:.1f} of "
            f"{peak:.0f} GFLOP/s; {step('64')}.{alone}"
        )
    return notes


def build_report(
    plan: dict[str, Any],
    rounds: list[dict[str, Any]],
    profile: dict[str, Any],
    contention_rounds: list[dict[str, Any]],
) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    single = {peer: peer_figure(rounds, peer, "single_stream") for peer in ("ours", "transformers", "ctranslate2")}
    figures["single_stream"] = {
        "unit": "generated tokens/s, one request at a time (prefill included)",
        "prompt_tokens": [len(p) for p in plan["single_stream_prompts"]],
        "new_tokens_per_request": plan["new_tokens"],
        **single,
        "identical_outputs_vs_ours": {
            peer: _identical(rounds, "single_stream", peer) for peer in ("transformers", "ctranslate2")
        },
    }
    batch_figures: dict[str, dict[str, Any]] = {"1": single}
    for size in plan["batch_prompts"]:
        batch_figures[size] = {
            peer: peer_figure(rounds, peer, f"batch_{size}") for peer in ("ours", "ctranslate2", "transformers")
        }
        batch_figures[size]["prompt_tokens"] = [len(p) for p in plan["batch_prompts"][size]]
    figures["batch_vs_ctranslate2"] = {
        "unit": "generated tokens/s for the whole batch (prefill included); batch 1 = the single-stream figure",
        "new_tokens_per_request": plan["new_tokens"],
        **{size: figure for size, figure in batch_figures.items() if size != "1"},
        "1": {peer: single[peer] for peer in ("ours", "ctranslate2", "transformers")},
    }
    http_runs = [record["http"]["mixed_concurrent"] for record in rounds]
    asked = sum(r["max_new_tokens"] for r in plan["mixed"])
    figures["http_16_clients_mixed"] = {
        "unit": "generated tokens/s over all 16 requests (only the tokens each request asked for)",
        "prompt_tokens": [len(r["ids"]) for r in plan["mixed"]],
        "max_new_tokens": [r["max_new_tokens"] for r in plan["mixed"]],
        "ours_http": {**spread([r["output_throughput"] for r in http_runs]), "tokens": http_runs[0]["output_tokens"]},
        "ours_in_process": peer_figure(rounds, "ours", "mixed_batch"),
        "transformers_sequential": peer_figure(rounds, "transformers", "mixed_sequential"),
        "transformers_static_batch": {
            **peer_figure(rounds, "transformers", "mixed_static_batch"),
            "tokens_computed": rounds[0]["transformers"]["workloads"]["mixed_static_batch"]["tokens_computed"],
        },
        "ctranslate2_batch": peer_figure(rounds, "ctranslate2", "mixed_batch"),
        "seconds": spread([r["duration_s"] for r in http_runs]),
        "server_cpu_seconds": spread([r["server_cpu_seconds"] for r in http_runs]),
        "client_cpu_seconds": spread([r["client_cpu_seconds"] for r in http_runs]),
        "method": "16 concurrent clients, one non-streamed POST /v1/completions each (ignore_eos, temperature 0), "
        "against a fresh `aieng serve` per round; peers in-process on the same token ids",
    }
    if figures["http_16_clients_mixed"]["ours_http"]["tokens"] != asked:
        raise RuntimeError("the HTTP clients did not get the tokens they asked for")
    figures["serving_metrics"] = {
        "definitions": METRIC_DEFINITIONS,
        "slo_ms": SLO_MS,
        "method": "streamed POST /v1/completions (stream_options.include_usage); closed loop of N clients, "
        "or open loop with Poisson arrivals (seeded); prompts and max_tokens cycled from the sweep list",
        "sweep_prompt_tokens": [len(r["ids"]) for r in plan["sweep_requests"]],
        "sweep_max_new_tokens": [r["max_new_tokens"] for r in plan["sweep_requests"]],
        **spread_tree([record["http"]["sweep"] for record in rounds]),
    }
    figures["int8_vs_ctranslate2_int8"] = int8_figures(plan, rounds)
    figures["step_graphs"] = step_graph_figures(rounds)
    figures["http_vs_in_process"] = http_vs_in_process(plan, rounds)
    figures["flops_at_batch_64"] = _flops(plan, rounds, max(int(size) for size in plan["batch_prompts"]))
    peak = figures["flops_at_batch_64"]["matmul_peak_gflops"]["median"]

    def median(figure: dict[str, Any]) -> float:
        return float(figure["median"])

    http = figures["http_16_clients_mixed"]
    goals = {
        "single_stream_vs_transformers": goal(
            "single_stream_vs_transformers", median(single["ours"]), median(single["transformers"])
        ),
        **{
            f"batch_{size}_vs_ctranslate2": goal(
                f"batch_{size}_vs_ctranslate2",
                median(batch_figures[size]["ours"]),
                median(batch_figures[size]["ctranslate2"]),
            )
            for size in ("1", "16", "64")
            if size in batch_figures
        },
        "http_16_clients_vs_transformers_sequential": goal(
            "http_16_clients_vs_transformers_sequential",
            median(http["ours_http"]),
            median(http["transformers_sequential"]),
        ),
        "http_16_clients_vs_transformers_static_batch": goal(
            "http_16_clients_vs_transformers_static_batch",
            median(http["ours_http"]),
            median(http["transformers_static_batch"]),
        ),
        "http_16_clients_vs_ctranslate2_batch": goal(
            "http_16_clients_vs_ctranslate2_batch", median(http["ours_http"]), median(http["ctranslate2_batch"])
        ),
    }
    largest = str(max(int(size) for size in plan["batch_prompts"]))
    int8 = figures["int8_vs_ctranslate2_int8"][largest]
    goals["int8_batch_64_vs_ctranslate2_int8"] = goal(
        "int8_batch_64_vs_ctranslate2_int8", median(int8["ours_int8"]), median(int8["ctranslate2_int8"])
    )
    for name, figure in figures["http_vs_in_process"].items():
        if name in GOALS and "worse_ratio" in figure:
            goals[name] = judged(name, figure["worse_ratio"]["median"])
    fraction = figures["flops_at_batch_64"]["fraction_of_peak"]["median"]
    goals["flops_fraction_of_matmul_peak_at_batch_64"] = judged("flops_fraction_of_matmul_peak_at_batch_64", fraction)
    figures["contention"], contention_goals = contention_figures(plan, contention_rounds)
    goals |= contention_goals
    return {"figures": figures, "goals": goals, "bounds": _bounds(figures, goals, profile, peak)}

"""Gate step 5: the candidate under load in a real `aieng serve`, against the SLOs.

The candidate is served by `aieng serve --bundle PATH` in a subprocess on a free loopback port
(loadgen/server_process.py), with the gate's config. Load comes from loadgen/http_load.py: a
closed loop of N clients at each `gate.concurrencies`, then open-loop Poisson arrivals at
each `gate.poisson_rates`; `gate.requests_per_level` streamed /v1/completions requests per
level (ignore_eos, so each generates exactly its max_tokens, cycled from `gate.max_new_tokens`;
prompts cycled over `serving.warmup_prompt_lengths` tokens), each level bounded by
`gate.max_seconds_per_level`. The figures are loadgen/stats.py's (TTFT, TPOT, ITL,
E2EL percentiles, throughput, goodput), with its definitions.

At every level: no failed request (a 429 is counted apart, as `rejected_429`, not as an
error), every request sent and finished within the bound, P99 TTFT <= slo_ttft_p99_ms, P99
E2EL <= slo_e2el_p99_ms, and the fraction of good requests (TTFT <= slo_ttft_ms and TPOT <=
slo_tpot_ms; 429s and unsent requests are not good) >= goodput_floor. These are absolute:
whether the candidate is slower than what serves is the compare step's question, asked of
both bundles in the same run (compare.py). The server is always stopped (SIGTERM, then a
kill), and must drain and exit 0.

During each level (and over all of them) the step measures the CPU other processes took on
this process's CPUs (`others_cores`, busy.py): when every level that broke an SLO did so while
others took at least `gate.busy_cores_limit` of our cores, the step raises GateInconclusive
instead of GateFailed (no refusal; a re-run can pass). A level that met its SLOs passed,
whatever the load; one that broke an SLO on a quiet machine fails the gate.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from aieng_core.config import AiengConfig
from aieng_core.gate.busy import CpuShare, LevelLoad, cpu_share, excused, gate_sampler, judge
from aieng_core.gate.report import GateFailed, GateInconclusive

POISSON_SEED = 7  # the same arrival offsets in every gate run
WARMUP_NEW_TOKENS = 2
FILLER = (
    "The data pipeline lands raw text every day, cleans it, trains a small language model from "
    "scratch and serves it over HTTP. Every artifact is hashed, every step is recorded, and a "
    "bundle reaches production only through the gate: warmup, stress test, rollback drill. "
)


def stress_requests(bundle_path: Path, config: AiengConfig, count: int | None = None) -> list[Any]:
    """`count` (default `gate.requests_per_level`) LoadRequests: prompts cut from a fixed text to each of
    `serving.warmup_prompt_lengths` tokens in turn (shortened where the prompt and its
    max_tokens would not fit max_context), max_tokens cycled from `gate.max_new_tokens`."""
    import json

    from aieng_core.loadgen.http_load import LoadRequest
    from aieng_core.tokenizer.bpe import load_tokenizer

    tokenizer = load_tokenizer(bundle_path)
    serving = json.loads((bundle_path / "serving.json").read_text(encoding="utf-8"))
    max_context, eos = int(serving["max_context"]), int(serving["eos_token_id"])

    def encode(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False).ids)

    ids = [token for token in encode(FILLER) if token != eos]
    text_ids = ids * (2 * max_context // max(len(ids), 1) + 2)
    lengths, new_tokens = config.serving.warmup_prompt_lengths, config.gate.max_new_tokens
    requests = []
    for index in range(config.gate.requests_per_level if count is None else count):
        max_tokens = new_tokens[index % len(new_tokens)]
        if max_tokens >= max_context:
            raise GateFailed(
                "stress",
                "max_new_tokens",
                f"gate.max_new_tokens {max_tokens} leaves no room for a prompt in the bundle's max_context",
                value=max_tokens,
                limit=max_context - 1,
            )
        length = min(lengths[index % len(lengths)], max_context - max_tokens)
        start = (index * 7) % len(ids)
        while True:
            prompt = tokenizer.decode(text_ids[start : start + length])
            prompt_tokens = len(encode(prompt))
            if 1 <= prompt_tokens <= max_context - max_tokens or length == 1:
                break
            length -= 1
        requests.append(LoadRequest(prompt, prompt_tokens, max_tokens))
    return requests


def level_figures(kind: str, load: float, records: list[Any], planned: int, slo_ms: dict[str, float]) -> dict[str, Any]:
    """One load level: loadgen/stats.py's summarize's figures, with failures split into errors,
    429s and requests the time bound cut (unfinished) or never sent (unsent)."""
    from aieng_core.loadgen.http_load import NOT_FINISHED
    from aieng_core.loadgen.stats import summarize

    rejected = [r for r in records if not r.ok and (r.error or "").startswith("HTTP 429")]
    failed = [r for r in records if not r.ok and r not in rejected]
    unfinished = [r for r in failed if (r.error or "").startswith(NOT_FINISHED)]
    figures: dict[str, Any] = {
        "kind": kind,
        ("concurrency" if kind == "closed_loop" else "rate_per_s"): load,
        "planned": planned,
        "sent": len(records),
        "unsent": planned - len(records),
        "completed": sum(1 for r in records if r.ok),
        "errors": len(failed),
        "unfinished": len(unfinished),
        "rejected_429": len(rejected),
        "error_rate": len(failed) / len(records) if records else 0.0,
        "error_samples": sorted({str(r.error) for r in failed})[:5],
    }
    if figures["completed"]:
        summary = summarize(records, slo_ms)
        summary.pop("errors")
        summary.pop("requests")
        summary.pop("completed")
        summary.pop("failed")
        figures.update(summary)
        figures["good_fraction"] = summary["good_requests"] / planned
    else:
        figures.update(good_requests=0, good_fraction=0.0)
    return figures


def slo_violations(name: str, level: dict[str, Any], config: AiengConfig) -> list[dict[str, Any]]:
    """Each SLO the level broke: {figure, value, limit, reason}."""
    gate = config.gate
    found = []

    def broke(figure: str, value: Any, limit: Any, reason: str) -> None:
        found.append({"figure": f"{name}.{figure}", "value": value, "limit": limit, "reason": reason})

    if level["unsent"] or level["unfinished"]:
        broke(
            "unfinished",
            level["unsent"] + level["unfinished"],
            0,
            f"{level['unsent']} requests not sent and {level['unfinished']} not finished within "
            f"gate.max_seconds_per_level ({gate.max_seconds_per_level:g} s)",
        )
    if level["errors"] > level["unfinished"]:
        broke(
            "errors",
            level["errors"] - level["unfinished"],
            0,
            f"failed requests (429s are counted apart): {level['error_samples']}",
        )
    if not level["completed"]:
        broke("completed", 0, level["planned"], "no request completed")
        return found
    ttft, e2el = level["ttft_ms"]["p99"], level["e2el_ms"]["p99"]
    if ttft is not None and ttft > gate.slo_ttft_p99_ms:
        broke("ttft_ms.p99", ttft, gate.slo_ttft_p99_ms, "P99 time to first token above gate.slo_ttft_p99_ms")
    if e2el is not None and e2el > gate.slo_e2el_p99_ms:
        broke("e2el_ms.p99", e2el, gate.slo_e2el_p99_ms, "P99 end-to-end latency above gate.slo_e2el_p99_ms")
    if level["good_fraction"] < gate.goodput_floor:
        broke(
            "good_fraction",
            level["good_fraction"],
            gate.goodput_floor,
            f"too few requests within slo_ttft_ms ({gate.slo_ttft_ms:g}) and slo_tpot_ms ({gate.slo_tpot_ms:g})",
        )
    return found


def stress_step(
    home: Path, bundle_path: Path, config: AiengConfig, config_path: Path, work_dir: Path
) -> dict[str, Any]:
    """Serve the candidate, load it level by level, check the SLOs."""
    from aieng_core.gate.server_env import server_env
    from aieng_core.loadgen.http_load import closed_loop, poisson
    from aieng_core.loadgen.server_process import ServerProcess
    from aieng_core.loadgen.stats import METRIC_DEFINITIONS

    gate = config.gate
    slo_ms = {"ttft": gate.slo_ttft_ms, "tpot": gate.slo_tpot_ms}
    requests = stress_requests(bundle_path, config)
    bound = gate.max_seconds_per_level
    figures: dict[str, Any] = {
        "requests_per_level": gate.requests_per_level,
        "max_new_tokens": list(gate.max_new_tokens),
        "prompt_tokens": sorted({r.prompt_tokens for r in requests}),
        "max_seconds_per_level": bound,
        "slo": {
            "ttft_p99_ms": gate.slo_ttft_p99_ms,
            "e2el_p99_ms": gate.slo_e2el_p99_ms,
            "goodput_ttft_ms": gate.slo_ttft_ms,
            "goodput_tpot_ms": gate.slo_tpot_ms,
            "goodput_floor": gate.goodput_floor,
        },
        "definitions": METRIC_DEFINITIONS,
        "levels": {},
    }
    log_path = work_dir / "stress-server.log"
    server = ServerProcess(bundle_path, log_path, server_env(home, config_path))
    figures["server"] = {"log": str(log_path)}
    share = cpu_share()
    figures["cpu"] = {"cpus": share.cpus, "cores": share.cores, "busy_cores_limit": gate.busy_cores_limit}
    levels: dict[str, dict[str, Any]] = figures["levels"]
    # Two windows: each level's, and all the levels' (sampled while the server runs: the CPU of a
    # process that ended within a window would read as another's).
    per_level, whole = gate_sampler(lambda: [server.pid]), gate_sampler(lambda: [server.pid])
    try:
        with server:
            figures["server"]["ready_seconds"] = server.ready_seconds
            # A first request of each client before measuring (the server warmed its engine up).
            warm = [replace(r, max_tokens=WARMUP_NEW_TOKENS) for r in requests[: max(gate.concurrencies)]]
            warmed = closed_loop(server.port, warm, len(warm), stream=True, max_seconds=bound)
            figures["warmup_requests"] = {"sent": len(warmed), "completed": sum(1 for r in warmed if r.ok)}
            runs: list[tuple[str, str, float, Callable[[], list[Any]]]] = [
                (f"concurrency={c}", "closed_loop", c, partial(closed_loop, server.port, requests, c, True, bound))
                for c in gate.concurrencies
            ]
            runs += [
                (
                    f"poisson={rate:g}",
                    "poisson",
                    rate,
                    partial(poisson, server.port, requests, rate, POISSON_SEED, True, bound),
                )
                for rate in gate.poisson_rates
            ]
            whole.sample()
            for name, kind, load, run in runs:
                per_level.sample()  # the window between levels is not this level's
                started = time.perf_counter()
                records = run()
                use = per_level.sample()
                levels[name] = level_figures(kind, load, records, len(requests), slo_ms)
                levels[name]["wall_seconds"] = time.perf_counter() - started
                levels[name]["others_cores"] = None if use is None else use.others_cores
                levels[name]["ours_cores"] = None if use is None else use.ours_cores
            use = whole.sample()
            figures["cpu"]["others_cores"] = None if use is None else use.others_cores
        figures["server"]["exit_code"] = server.stop()
    except RuntimeError as exc:  # the server never became ready, or exited
        figures["server"]["exit_code"] = server.stop()
        raise GateFailed(
            "stress", "server", f"`aieng serve --bundle {bundle_path}` failed: {exc}", figures=figures
        ) from None
    finally:
        server.stop()

    by_level = {name: slo_violations(name, level, config) for name, level in levels.items()}
    loads = [
        LevelLoad(name, tuple(v["figure"].removeprefix(f"{name}.") for v in found), levels[name]["others_cores"])
        for name, found in by_level.items()
    ]
    if figures["server"]["exit_code"] != 0:
        by_level["server"] = [
            {
                "figure": "server.exit_code",
                "value": figures["server"]["exit_code"],
                "limit": 0,
                "reason": f"the server did not drain and exit 0 after SIGTERM (log: {log_path})",
            }
        ]
        loads.append(LevelLoad("server", ("exit_code",), None))  # no load excuses it
    violations = [v for found in by_level.values() for v in found]
    figures["violations"] = violations
    figures["outcome"] = outcome = judge(loads, share, gate.busy_cores_limit)
    if outcome == "passed":
        return figures
    more = f" ({len(violations) - 1} more violations in the report)" if len(violations) > 1 else ""
    if outcome == "inconclusive":
        broken = [load for load in loads if load.broken]
        first = by_level[broken[0].name][0]
        raise GateInconclusive(
            "stress",
            first["figure"],
            _busy_reason(broken, first, share, gate.busy_cores_limit),
            first["value"],
            first["limit"],
            figures=figures,
        )
    # The first violation at a level the machine does not excuse: the one that refuses the bundle.
    quiet = next(load for load in loads if load.broken and not excused(load, share, gate.busy_cores_limit))
    first = by_level[quiet.name][0]
    raise GateFailed("stress", first["figure"], first["reason"] + more, first["value"], first["limit"], figures=figures)


def _busy_reason(broken: list[LevelLoad], first: dict[str, Any], share: CpuShare, limit: float) -> str:
    """GateInconclusive's reason: `the machine was busy (other processes took 1.02 of 2 cores
    during concurrency=8; there concurrency=8.good_fraction = 0.7812, limit 0.9): …`."""
    level = broken[0]
    taken = share.taken(level.others_cores or 0.0)  # measured: an unmeasured level is never excused
    more = f"; {len(broken) - 1} more levels broke SLOs while it was busy" if len(broken) > 1 else ""
    return (
        f"the machine was busy (other processes took {taken:.2f} of {share.cores} cores during {level.name}; "
        f"there {first['figure']} = {first['value']:.4g}, limit {first['limit']:.4g}{more}): the stress step's "
        f"SLOs say nothing of the bundle then (gate.busy_cores_limit {limit:g}); a re-run can pass"
    )

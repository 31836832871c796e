"""Where one engine step's time goes, at batch 1 and at the largest batch: the evidence behind
every missed goal in the serving benchmark.

In a fresh process (the `profile` worker), our engine runs the benchmark's prompts step by
step; each step's wall time is split into
- model forward: the runner's prefill/decode forwards (ModelRunner.prefill_logits and
  decode_logits, timed by wrapping them);
- sampling: aieng_core.serving.sampling.sample as the runner calls it;
- the rest: scheduling, detokenizing, bookkeeping -- the engine's Python around the model.
Only decode-only steps (no prefill in the step) enter these figures (means, so the parts
add up to the step), so they describe the steady state. Decode rows attend in groups, each
up to its own longest row (model/decode_attention.py): the padded share of the attended
positions is reported as run, and as one attention over every row up to the longest would have
had it (the engine before the groups).

Two more views of the same decode steps: the model's linear layers run alone (F.linear with
the model's own weights in model order on a batch of rows, nothing else), the matmul time a
step cannot beat;
and torch.profiler, whose operator self-times split the wall into time inside aten operators
and the Python/dispatch time between them (the profiler slows every call, so its shares are
indicative), count the operator calls per step and name the heaviest operators.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from aieng_core.bench.serving_workers import _prologue, load_engine

TOP_OPERATORS = 8


@contextmanager
def _timed(engine: Any) -> Iterator[dict[str, float]]:
    """Time the runner's forwards and the sampler while the block runs; seconds per step in the bucket."""
    from aieng_core.serving import model_runner

    bucket = {"prefill": 0.0, "decode": 0.0, "sampling": 0.0}

    def timer(function: Callable[..., Any], key: str) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                bucket[key] += time.perf_counter() - started

        return wrapper

    runner = engine.runner
    original_sample = model_runner.sample
    model_runner.sample = timer(original_sample, "sampling")
    runner.prefill_logits = timer(type(runner).prefill_logits.__get__(runner), "prefill")
    runner.decode_logits = timer(type(runner).decode_logits.__get__(runner), "decode")
    try:
        yield bucket
    finally:
        model_runner.sample = original_sample
        del runner.prefill_logits, runner.decode_logits


def _admit(engine: Any, prompts: list[list[int]], new: int) -> None:
    from aieng_core.serving.request import SamplingParams

    for index, prompt in enumerate(prompts):
        engine.add_request(f"profile-{index}", prompt, SamplingParams(max_new_tokens=new, ignore_eos=True))


def _prefilling(engine: Any) -> bool:
    return bool(engine.scheduler.num_waiting) or any(not r.output_ids for r in engine.scheduler.running)


def _run(engine: Any, bucket: dict[str, float], until_decode: bool = False) -> list[dict[str, Any]]:
    """engine.step() until no work is left (or, with until_decode, until every request has
    been prefilled); one record per step."""
    records = []
    while engine.has_work and not (until_decode and not _prefilling(engine)):
        running = [r for r in engine.scheduler.running if r.output_ids]
        lengths = [r.num_tokens for r in running]
        rows = max((r.slot for r in running), default=-1) + 1
        for key in bucket:
            bucket[key] = 0.0
        started = time.perf_counter()
        engine.step()
        wall = time.perf_counter() - started
        step = engine.last_step
        chunks = step.prefill_chunks if step else ()
        attended, cells = engine.runner.last_attention if lengths else (0, 0)
        records.append(
            {
                "wall": wall,
                **bucket,
                "decode_rows": rows,
                "attended": attended,
                "attention_cells": cells,  # as the step ran: each group up to its longest row
                "attention_cells_one_group": rows * max(lengths, default=0),
                "prefill_tokens": step.prefill_tokens if step else 0,
                # What the same prefill computed when prompts were right-padded to the longest.
                "prefill_cells_right_padded": len(chunks) * max(chunks, default=0),
            }
        )
    return records


def _steps(engine: Any, prompts: list[list[int]], new: int) -> list[dict[str, Any]]:
    with _timed(engine) as bucket:
        _admit(engine, prompts, new)
        return _run(engine, bucket)


def _padded(records: list[dict[str, Any]]) -> int:
    return sum(r["prefill_cells_right_padded"] for r in records)


def _split(records: list[dict[str, Any]]) -> dict[str, Any]:
    decode_only = [r for r in records if r["prefill"] == 0.0 and r["decode"] > 0.0]
    if not decode_only:
        return {"decode_steps": 0}
    # Means, so that the parts add up to the step exactly.
    wall = statistics.fmean(r["wall"] for r in decode_only)
    forward = statistics.fmean(r["decode"] for r in decode_only)
    sampling = statistics.fmean(r["sampling"] for r in decode_only)
    cells = sum(r["attention_cells"] for r in decode_only)
    one_group = sum(r["attention_cells_one_group"] for r in decode_only)
    attended = sum(r["attended"] for r in decode_only)
    return {
        "decode_steps": len(decode_only),
        "step_ms": wall * 1000,
        "forward_ms": forward * 1000,
        "sampling_ms": sampling * 1000,
        "scheduler_and_python_ms": (wall - forward - sampling) * 1000,
        "forward_share": forward / wall,
        "sampling_share": sampling / wall,
        "scheduler_and_python_share": (wall - forward - sampling) / wall,
        "attention_padding_share": 1 - attended / cells if cells else 0.0,
        "attention_padding_share_one_group": 1 - attended / one_group if one_group else 0.0,
        "prefill_steps": len(records) - len(decode_only),
        "prefill_ms_total": sum(r["prefill"] for r in records) * 1000,
        # Packed prefill computes only the prompts' tokens; right-padding them computed this share more.
        "prefill_padding_share": 0.0,
        "prefill_padding_share_if_right_padded": (
            1 - sum(r["prefill_tokens"] for r in records) / padded if (padded := _padded(records)) else 0.0
        ),
    }


def _operators(engine: Any, prompts: list[list[int]], new: int) -> dict[str, Any]:
    """Decode steps only (the prefill runs before the profiler starts), under torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    with _timed(engine) as bucket:
        _admit(engine, prompts, new)
        _run(engine, bucket, until_decode=True)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            started = time.perf_counter()
            records = _run(engine, bucket)
            wall = time.perf_counter() - started
    steps = max(len(records), 1)
    events = [e for e in prof.key_averages() if e.key.startswith("aten::")]
    op_seconds = sum(e.self_cpu_time_total for e in events) / 1e6
    top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:TOP_OPERATORS]
    return {
        "note": "decode steps under torch.profiler, which slows every operator call: shares are indicative",
        "decode_steps": len(records),
        "step_ms": wall / steps * 1000,
        "forward_share_of_wall": sum(r["decode"] for r in records) / wall,
        # Time inside aten operators (forward and sampling); the rest of the wall is Python,
        # operator dispatch and the profiler's own cost.
        "aten_share_of_wall": op_seconds / wall,
        "aten_calls_per_step": sum(e.count for e in events) / steps,
        "top_operators": [
            {
                "name": e.key,
                "calls_per_step": e.count / steps,
                "self_ms_per_step": e.self_cpu_time_total / 1000 / steps,
                "share_of_wall": e.self_cpu_time_total / 1e6 / wall,
            }
            for e in top
        ],
    }


def linear_floor_ms(model: Any, batch: int, repeats: int = 30) -> float:
    """The model's own linear layers, in model order with their own weights, applied to a
    (batch, in_features) input: one decode step's matmuls with nothing else around them (the
    same weight bytes stream through the caches as in a real step), the time a step cannot beat."""
    import torch

    linears = [module for module in model.modules() if isinstance(module, torch.nn.Linear)]
    inputs = [torch.randn(batch, module.in_features) for module in linears]

    def one_step() -> None:
        for module, x in zip(linears, inputs):
            torch.nn.functional.linear(x, module.weight)

    with torch.inference_mode():
        for _ in range(3):
            one_step()
        started = time.perf_counter()
        for _ in range(repeats):
            one_step()
    return (time.perf_counter() - started) / repeats * 1000


def profile(plan: dict[str, Any]) -> dict[str, Any]:
    info = _prologue(plan)
    engine = load_engine(plan)
    engine.warmup(plan["warmup_prompt_lengths"])
    new = plan["new_tokens"]
    batches = {"1": plan["single_stream_prompts"][:1], **plan["batch_prompts"]}
    results = {}
    for size in plan["profile_batches"]:
        prompts = batches[str(size)]
        _steps(engine, prompts, 2)  # warm
        results[str(size)] = {
            **_split(_steps(engine, prompts, new)),
            "linear_layers_alone_ms": linear_floor_ms(engine.model, int(size)),
            "operators": _operators(engine, prompts, new),
        }
    return {**info, "batches": results}

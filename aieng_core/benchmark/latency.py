"""Latency against concurrency: a closed loop through a threaded engine (EngineLoop, as the
HTTP server drives it) keeping `concurrency` requests in flight until all are done.

Each request's timeline is a loadgen/stats.py RequestRecord, summarized with the same
definitions as the serving benchmark (TTFT, TPOT, ITL, E2EL), measured in process: from
submitting a request to the engine loop to its sink receiving each token.
"""

from __future__ import annotations

import threading
import time
from functools import partial
from typing import Any

from aieng_core.loadgen.stats import RequestRecord, summarize

# What a latency level keeps of loadgen/stats.py's summarize (no SLOs here: goodput is the gate's).
LEVEL_FIELDS = (
    "requests",
    "completed",
    "duration_s",
    "output_tokens",
    "request_throughput",
    "output_throughput",
    "ttft_ms",
    "tpot_ms",
    "itl_ms",
    "e2el_ms",
)
DEFINITIONS = {
    "ttft": "time to first token: request submitted to the engine loop -> its first token delivered (ms)",
    "tpot": "time per output token: (E2EL - TTFT) / (output_tokens - 1), per request (ms)",
    "itl": "inter-token latency: gaps between consecutive tokens delivered, pooled over all requests (ms)",
    "e2el": "end-to-end latency: request submitted -> its last token delivered (ms)",
    "percentiles": "linear interpolation between closest ranks (numpy.percentile's default)",
    "source": "aieng_core/loadgen/stats.py: the names and formulas of vLLM `bench serve`",
}


def engine_closed_loop(
    engine: Any, prompts: list[list[int]], new_tokens: int, concurrency: int, timeout_s: float
) -> list[RequestRecord]:
    """Run every prompt (greedy, ignore_eos, new_tokens each) through an EngineLoop with at
    most `concurrency` in flight: each finished request submits the next. Raises TimeoutError
    when they are not all done within `timeout_s`."""
    from aieng_core.serving.engine import RequestOutput
    from aieng_core.serving.engine_loop import EngineLoop
    from aieng_core.serving.request import SamplingParams

    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    records = [RequestRecord(prompt_tokens=len(p), output_tokens=new_tokens, sent=0.0) for p in prompts]
    lock = threading.Lock()
    all_done = threading.Event()
    state = {"next": 0, "finished": 0}
    loop = EngineLoop(engine)

    def finish(index: int, error: str | None) -> None:
        record = records[index]
        record.done, record.ok, record.error = time.monotonic(), error is None, error
        with lock:
            state["finished"] += 1
            last = state["finished"] == len(records)
        if last:
            all_done.set()
        else:
            submit_next()

    def sink(index: int, output: RequestOutput) -> None:
        if output.new_token_ids:
            records[index].chunk_times.append(time.monotonic())
        if output.finished:
            ok = output.finish_reason == "length" and len(output.token_ids) == new_tokens
            finish(index, None if ok else f"{output.finish_reason} after {len(output.token_ids)} tokens")

    def submit_next() -> None:
        with lock:
            index = state["next"]
            if index >= len(records):
                return
            state["next"] += 1
        records[index].sent = time.monotonic()
        try:
            loop.submit(f"latency-c{concurrency}-{index}", prompts[index], params, partial(sink, index))
        except Exception as exc:  # refused: recorded as a failed request, and the loop goes on
            finish(index, f"{type(exc).__name__}: {exc}")

    loop.start()
    try:
        for _ in range(min(concurrency, len(prompts))):
            submit_next()
        if not all_done.wait(timeout_s):
            raise TimeoutError(
                f"latency at concurrency {concurrency}: {state['finished']} of {len(records)} requests done "
                f"after {timeout_s:g} s"
            )
    finally:
        loop.stop()
    return records


def latency_level(
    engine: Any, prompts: list[list[int]], new_tokens: int, concurrency: int, timeout_s: float
) -> dict[str, Any]:
    """One concurrency level's figures; every request must complete with exactly new_tokens."""
    records = engine_closed_loop(engine, prompts, new_tokens, concurrency, timeout_s)
    failed = [record.error for record in records if not record.ok]
    if failed:
        raise RuntimeError(f"latency at concurrency {concurrency}: {len(failed)} requests failed: {failed[:3]}")
    summary = summarize(records, {})
    return {"concurrency": concurrency, **{name: summary[name] for name in LEVEL_FIELDS}}

"""The serving benchmark's contention workload: each peer alone, then beside one busy process.

A busy process is `python -c "while True: pass"`: one core taken for as long as it runs, as a
neighbour's batch job takes it (issue 39: on 2 cores the server then fell from 6,911 to 59
tokens/s, its OpenMP threads waiting at every barrier for the one the kernel had descheduled).

Peers (serving_plan.CONTENTION_PEERS), each condition a fresh process of its own, so that no
run measures a transition from one condition to the other:

- contention_ours_{alone,busy}: a fresh `aieng serve` of the plan's bundle with its normal
  config (serving.adapt_threads: the engine steps with fewer threads while others take its
  cores, cpu/governor.py);
- contention_baseline_{alone,busy}: the same server with serving.adapt_threads false and
  serving.threads the plan's threads: always that many threads, as before it adapted (the
  spin-waiting build);
- contention_ctranslate2_{alone,busy}: CTranslate2 in-process, through the ctranslate2 peer's
  own code (serving_workers.py).

"busy" starts the busy process (a child of the worker) before anything else, keeps it running
through the whole measurement and always kills it when the worker's run ends.

A server worker, right after /health/ready (the first traffic it gets): FIRST_ROUNDS rounds of
the 16 mixed requests from 16 concurrent clients, not streamed, each round's wall time kept
(the first against the third says how long the server takes to reach its speed); then, after
a warmup as the http worker's, (a) the same 16 requests again, the figure (tokens/s = output
tokens / wall time from the first request sent to the last answered), (b) the single-stream
requests one after another from one client, streamed; then a scrape of /metrics (the engine's
thread count and the CPU others took, as the server saw them at the end). CTranslate2's
worker times its batch of the 16 mixed requests and its single stream, each after a warmup,
exactly as the ctranslate2 peer does.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

import psutil

from aieng_core.bench.serving_workers import (
    WARMUP_NEW_TOKENS,
    _prologue,
    _workloads,
    ctranslate2_generators,
    load_requests,
    measured_run,
)

CONDITIONS = ("alone", "busy")
BUSY_LOOP = "while True: pass"
FIRST_ROUNDS = 3  # rounds of the 16 mixed requests right after ready: the first against the last
SCRAPED_METRICS = ("aieng_engine_threads", "aieng_cpu_other_processes_cores")


@contextmanager
def busy_process(condition: str) -> Iterator[subprocess.Popen[bytes] | None]:
    """For "busy": one process spinning on a core from now until the block ends (killed then,
    whatever happened); for "alone": none."""
    if condition not in CONDITIONS:
        raise ValueError(f"condition must be one of {CONDITIONS}, not {condition!r}")
    if condition == "alone":
        yield None
        return
    process = subprocess.Popen([sys.executable, "-c", BUSY_LOOP])
    try:
        yield process
    finally:
        process.kill()
        process.wait()


def busy_figures(process: subprocess.Popen[bytes] | None) -> dict[str, Any]:
    """The busy process's pid and the cores it took over its life (1.0: a whole core). One that
    stopped before the measurement ended fails the run: its figures were not taken beside it."""
    if process is None:
        return {"busy_process_pid": None}
    if process.poll() is not None:
        raise RuntimeError(f"the busy process exited ({process.returncode}) before the measurement ended")
    busy = psutil.Process(process.pid)
    times = busy.cpu_times()
    lived = time.time() - busy.create_time()
    return {"busy_process_pid": process.pid, "busy_process_cores": (times.user + times.system) / lived}


def scrape_metrics(port: int) -> dict[str, float]:
    """The server's SCRAPED_METRICS from GET /metrics (Prometheus text, unlabelled gauges)."""
    from aieng_core.loadgen.http_client import request

    reply = request(port, "GET", "/metrics")
    if reply.status != 200:
        raise RuntimeError(f"GET /metrics answered {reply.status}")
    found: dict[str, float] = {}
    for line in reply.body.decode("utf-8").splitlines():
        name, _, value = line.partition(" ")
        if name in SCRAPED_METRICS:
            found[name] = float(value)
    missing = [name for name in SCRAPED_METRICS if name not in found]
    if missing:
        raise RuntimeError(f"the server's /metrics has no {', '.join(missing)}")
    return found


def contention_server(plan: dict[str, Any], peer: str, condition: str) -> dict[str, Any]:
    """`peer` ("ours" or "baseline": plan["contention_servers"]) as a fresh `aieng serve`, alone
    or beside the busy process: the first rounds after ready, then the two workloads."""
    from aieng_core.loadgen.http_load import closed_loop
    from aieng_core.loadgen.server_process import ServerProcess

    server_settings = plan["contention_servers"][peer]
    env = {**os.environ, **plan["server_env"], "AIENG_CONFIG": server_settings["config"]}
    info = {"pid": os.getpid(), "load_average_1min": os.getloadavg()[0], "peer": peer, "condition": condition}
    info |= {"adapt_threads": server_settings["adapt_threads"], "threads": server_settings["threads"]}
    slo = plan["slo_ms"]
    mixed, single = load_requests(plan["mixed"]), load_requests(plan["single_stream_requests"])
    log_path = Path(plan["work_dir"]) / f"server-contention-{peer}-{condition}-{os.getpid()}.log"

    # The busy process first: the server starts, warms up and turns ready beside it.
    with busy_process(condition) as busy, ServerProcess(Path(plan["bundle_dir"]), log_path, env) as server:
        run_mixed = partial(closed_loop, server.port, mixed, len(mixed), stream=False)
        first_rounds = [measured_run(server, run_mixed, slo) for _ in range(FIRST_ROUNDS)]
        # Warmup beyond the server's own, as the http worker's: every prompt shape, streamed and not.
        warm = [replace(r, max_tokens=WARMUP_NEW_TOKENS) for r in mixed]
        measured_run(server, partial(closed_loop, server.port, warm, len(warm), stream=True), slo)
        measured_run(server, partial(closed_loop, server.port, warm, len(warm), stream=False), slo)
        figures = {
            "server_pid": server.pid,
            "ready_seconds": server.ready_seconds,
            "first_rounds": first_rounds,
            "mixed_concurrent": measured_run(server, run_mixed, slo),
            "single_stream": measured_run(server, partial(closed_loop, server.port, single, 1, stream=True), slo),
            "metrics_at_end": scrape_metrics(server.port),
            **busy_figures(busy),
        }
        figures["server_exit_code"] = server.stop()
    return {**info, **figures, "load_average_1min_at_end": os.getloadavg()[0]}


def contention_ctranslate2(plan: dict[str, Any], condition: str) -> dict[str, Any]:
    """CTranslate2 alone or beside the busy process: the ctranslate2 peer's single stream and
    its batch of the 16 mixed requests (rows stopping at their own lengths), each warmed up."""
    with busy_process(condition) as busy:
        info = {**_prologue(plan), "condition": condition}
        generator, generate, generate_mixed = ctranslate2_generators(plan)
        # The peer's own workloads less its fixed-size batches: single_stream and mixed_batch.
        workloads = _workloads({**plan, "batch_prompts": {}}, generate, generate_mixed)
        figures = {"compute_type": generator.compute_type, "workloads": workloads, **busy_figures(busy)}
    return {**info, **figures, "load_average_1min_at_end": os.getloadavg()[0]}


def contention_workers() -> dict[str, Callable[[dict[str, Any]], dict[str, Any]]]:
    """Every contention worker by its name in serving_plan.CONTENTION_PEERS."""
    workers: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {}
    for condition in CONDITIONS:
        for peer in ("ours", "baseline"):
            workers[f"contention_{peer}_{condition}"] = partial(contention_server, peer=peer, condition=condition)
        workers[f"contention_ctranslate2_{condition}"] = partial(contention_ctranslate2, condition=condition)
    return workers

"""What each fresh process of the serving benchmark measures: one peer, one process.

run_serving_bench (serving_bench.py) writes a plan (serving_plan.py; plan.json: paths, thread
count, prompts as token ids and text, output lengths) and starts `python -m
aieng_core.bench.serving_bench --worker NAME PLAN`; the worker prints one JSON line. A peer
never shares a process with another peer, nor with the CTranslate2 converter (which loads the
model through transformers: CTranslate2 runs about ten times slower in such a process on this
machine).

- ours: our engine in-process (Engine.generate), its decode steps captured at warmup
  (step_graphs.py; the warmup's figures time each bucket's step captured and eager in this
  process): single stream, batches, the 16 mixed requests, and the fp32 torch.matmul peak of
  this process for the FLOP/s fraction;
- transformers: `generate` (greedy, use_cache, sdpa): single stream, batches (left-padded),
  the mixed requests one at a time and as one static left-padded batch;
- ctranslate2: `Generator.generate_batch` (greedy): single stream, batches, the mixed
  requests as one batch whose rows stop at their own lengths (a callback per token);
- convert: the CTranslate2 conversion, before any measurement;
- http: a real `aieng serve` subprocess and the load generator (this process): the 16 mixed
  requests from 16 concurrent clients, ours' single-stream and largest-batch workloads over
  HTTP (one client in turn; one client per prompt), streamed and not, then the
  serving-metrics sweep.

The contention workload's workers (the server and CTranslate2 alone and beside a busy process)
are in serving_contention.py; they share this module's helpers.

Every engine generates exactly the planned number of tokens (ours: ignore_eos; transformers:
no EOS token; CTranslate2: min_length = max_length) and each workload reports the tokens it
actually got, so the report can check that every peer did the same work. Each workload runs
once untimed (warmup) before it is timed.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

# A peer's generate(prompts, new_tokens) and generate_mixed(prompts, new_tokens_per_prompt).
Generate = Callable[[list[list[int]], int], list[list[int]]]
GenerateMixed = Callable[[list[list[int]], list[int]], list[list[int]]]

MATMUL_REPEAT_SECONDS = 0.3  # per size: repeat until this much time has passed (at least 3 runs)
WARMUP_NEW_TOKENS = 2  # a warmup runs each workload's prompts, batch shape and code paths, briefly


def outputs_digest(outputs: Sequence[Sequence[int]]) -> list[str]:
    """A short hash of each request's generated ids: equal outputs across peers, same digest."""
    return [hashlib.sha256(json.dumps(list(ids)).encode()).hexdigest()[:16] for ids in outputs]


def timed(run: Callable[[], list[list[int]]], asked: list[int], warm: Callable[[], object]) -> dict[str, Any]:
    """Warm up (the same prompts, WARMUP_NEW_TOKENS each), then time one run; `asked` is
    the tokens each request asked for, and each must have got exactly that many."""
    warm()
    started = time.perf_counter()
    outputs = run()
    seconds = time.perf_counter() - started
    got = [len(ids) for ids in outputs]
    if got != asked:
        raise RuntimeError(f"generated {got} tokens per request where {asked} were asked for")
    tokens = sum(got)
    return {
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_second": tokens / seconds,
        "digests": outputs_digest(outputs),
    }


def _prologue(plan: dict[str, Any]) -> dict[str, Any]:
    import torch

    torch.set_num_threads(plan["threads"])
    return {"pid": os.getpid(), "load_average_1min": os.getloadavg()[0], "threads": torch.get_num_threads()}


def _workloads(
    plan: dict[str, Any],
    generate: Callable[[list[list[int]], int], list[list[int]]],
    generate_mixed: Callable[[list[list[int]], list[int]], list[list[int]]] | None,
) -> dict[str, Any]:
    """The shared workloads, run through one peer's `generate(prompts, new_tokens)`."""
    new, warm = plan["new_tokens"], WARMUP_NEW_TOKENS
    single = plan["single_stream_prompts"]
    results: dict[str, Any] = {
        "single_stream": timed(
            lambda: [out for p in single for out in generate([p], new)],
            [new] * len(single),
            lambda: [generate([p], warm) for p in single],
        )
    }
    for size, prompts in plan["batch_prompts"].items():
        results[f"batch_{size}"] = timed(
            partial(generate, prompts, new), [new] * len(prompts), partial(generate, prompts, warm)
        )
    if generate_mixed is not None:
        mixed = plan["mixed"]
        prompts, lengths = [r["ids"] for r in mixed], [r["max_new_tokens"] for r in mixed]
        results["mixed_batch"] = timed(
            lambda: generate_mixed(prompts, lengths),
            lengths,
            lambda: generate_mixed(prompts, [warm] * len(prompts)),
        )
    return results


# ---- ours -------------------------------------------------------------------------------------
def load_engine(
    plan: dict[str, Any], int8: bool = False, prefix_cache_tokens: int = 0, step_graphs: str = "auto"
) -> Any:
    """Our engine on the plan's weights; decode steps captured at warmup as a server with
    serving.step_graphs `step_graphs` captures them (auto, as the server's default)."""
    import torch
    from safetensors.torch import load_file

    from aieng_core.model.hf_files import CONFIG_FILE, MODEL_FILE
    from aieng_core.model.llama import LlamaConfig, LlamaForCausalLM
    from aieng_core.model.weights import load_into
    from aieng_core.serving.engine import Engine, EngineLimits
    from aieng_core.serving.step_graphs import StepGraphSettings
    from aieng_core.tokenizer.bpe import load_tokenizer

    directory = Path(plan["model_dir"])
    config = LlamaConfig.from_hf_dict(json.loads((directory / CONFIG_FILE).read_text(encoding="utf-8")))
    model = LlamaForCausalLM(config)
    load_into(model, load_file(directory / MODEL_FILE))
    model.eval()
    if int8:
        from aieng_core.model.int8_weights import quantized_copy

        model = quantized_copy(model)
    torch.set_grad_enabled(False)
    graphs = StepGraphSettings(mode=step_graphs, cache_dir=Path(plan["work_dir"]) / "step-graph-cache")
    limits = EngineLimits(**plan["limits"])
    eos, key = plan["eos_token_id"], plan["bundle_id"]
    return Engine(model, load_tokenizer(directory), limits, eos, graphs, key, prefix_cache_tokens)


def matmul_peak(sizes: Sequence[int]) -> dict[str, Any]:
    """fp32 torch.matmul GFLOP/s (2 n^3 per product) for square n x n, best of repeated runs."""
    import torch

    per_size = {}
    for n in sizes:
        a, b = torch.randn(n, n), torch.randn(n, n)
        torch.matmul(a, b)
        best, runs, started = float("inf"), 0, time.perf_counter()
        while runs < 3 or time.perf_counter() - started < MATMUL_REPEAT_SECONDS:
            begin = time.perf_counter()
            torch.matmul(a, b)
            best = min(best, time.perf_counter() - begin)
            runs += 1
        per_size[str(n)] = 2 * n**3 / best / 1e9
    return {"gflops_by_size": per_size, "peak_gflops": max(per_size.values())}


def ours(plan: dict[str, Any], int8: bool = False) -> dict[str, Any]:
    from aieng_core.serving.request import SamplingParams

    info = _prologue(plan)
    engine = load_engine(plan, int8)
    warmup = engine.warmup(plan["warmup_prompt_lengths"])

    def generate(prompts: list[list[int]], new: int) -> list[list[int]]:
        outputs = engine.generate(prompts, SamplingParams(max_new_tokens=new, ignore_eos=True))
        return [list(o.token_ids) for o in outputs]

    def generate_mixed(prompts: list[list[int]], lengths: list[int]) -> list[list[int]]:
        params = [SamplingParams(max_new_tokens=n, ignore_eos=True) for n in lengths]
        return [list(o.token_ids) for o in engine.generate(prompts, params)]

    if int8:
        return {**info, "engine_warmup": warmup, "workloads": _workloads(plan, generate, None)}
    results = _workloads(plan, generate, generate_mixed)
    return {**info, "engine_warmup": warmup, "workloads": results, "matmul": matmul_peak(plan["matmul_sizes"])}


def ours_int8(plan: dict[str, Any]) -> dict[str, Any]:
    """Our engine on the int8 variant of the same weights (weight-only: float32 matmuls, captured)."""
    return ours(plan, int8=True)


# ---- transformers -------------------------------------------------------------------------------
def transformers_peer(plan: dict[str, Any]) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    info = _prologue(plan)
    model = AutoModelForCausalLM.from_pretrained(plan["model_dir"], attn_implementation="sdpa").eval()
    # No EOS token: every row runs to max_new_tokens (as ignore_eos), with no extra logits processor.
    model.generation_config.eos_token_id = None
    pad = plan["pad_token_id"]

    @torch.inference_mode()
    def run(prompts: list[list[int]], new: int) -> list[list[int]]:
        longest = max(len(p) for p in prompts)
        # Left padding: every row's last prompt token sits at the same column (HF's rule for decoder-only).
        ids = torch.tensor([[pad] * (longest - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (longest - len(p)) + [1] * len(p) for p in prompts])
        out = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=new, do_sample=False, use_cache=True, pad_token_id=pad
        )
        return out[:, longest:].tolist()

    def one_at_a_time(prompts: list[list[int]], lengths: list[int]) -> list[list[int]]:
        return [run([p], n)[0] for p, n in zip(prompts, lengths)]

    results = _workloads(plan, run, one_at_a_time)
    results["mixed_sequential"] = results.pop("mixed_batch")
    mixed = plan["mixed"]
    prompts, lengths = [r["ids"] for r in mixed], [r["max_new_tokens"] for r in mixed]

    def static_batch() -> list[list[int]]:
        # One batch must run to the longest request; each request keeps only what it asked for.
        rows = run(prompts, max(lengths))
        return [row[:n] for row, n in zip(rows, lengths)]

    results["mixed_static_batch"] = timed(static_batch, lengths, lambda: run(prompts, WARMUP_NEW_TOKENS))
    results["mixed_static_batch"]["tokens_computed"] = max(lengths) * len(lengths)
    return {**info, "workloads": results}


# ---- CTranslate2 --------------------------------------------------------------------------------
def ctranslate2_generators(plan: dict[str, Any], compute_type: str = "float32") -> tuple[Any, Generate, GenerateMixed]:
    """CTranslate2's Generator on the plan's conversion, with its generate(prompts, new_tokens) and
    generate_mixed(prompts, lengths): one batch whose rows stop at their own lengths."""
    import ctranslate2

    generator = ctranslate2.Generator(
        plan["ct2_dir"], device="cpu", compute_type=compute_type, intra_threads=plan["threads"], inter_threads=1
    )
    vocabulary = json.loads((Path(plan["ct2_dir"]) / "vocabulary.json").read_text(encoding="utf-8"))

    def run(prompts: list[list[int]], new: int, lengths: list[int] | None = None) -> list[list[int]]:
        counts = [0] * len(prompts)

        def stop_at_own_length(step: Any) -> bool:
            # Called once per generated token of a row; True stops that row (beam size 1).
            assert lengths is not None
            counts[step.batch_id] += 1
            return counts[step.batch_id] >= lengths[step.batch_id]

        results = generator.generate_batch(
            [[vocabulary[i] for i in p] for p in prompts],
            max_length=new,
            min_length=new,  # EOS can never end a row early
            sampling_topk=1,
            include_prompt_in_result=False,
            callback=stop_at_own_length if lengths is not None else None,
        )
        return [list(r.sequences_ids[0]) for r in results]

    def mixed(prompts: list[list[int]], lengths: list[int]) -> list[list[int]]:
        return run(prompts, max(lengths), lengths)

    return generator, run, mixed


def ctranslate2_peer(plan: dict[str, Any], compute_type: str = "float32") -> dict[str, Any]:
    info = _prologue(plan)
    generator, run, mixed = ctranslate2_generators(plan, compute_type)
    workloads = _workloads(plan, run, mixed if compute_type == "float32" else None)
    return {**info, "compute_type": generator.compute_type, "workloads": workloads}


def ctranslate2_int8(plan: dict[str, Any]) -> dict[str, Any]:
    """CTranslate2 with int8 weights and int8 matmuls (its compute_type int8) on the same conversion."""
    return ctranslate2_peer(plan, "int8")


def convert(plan: dict[str, Any]) -> dict[str, Any]:
    import ctranslate2

    started = time.perf_counter()
    ctranslate2.converters.TransformersConverter(plan["model_dir"]).convert(plan["ct2_dir"], force=True)
    return {"pid": os.getpid(), "seconds": time.perf_counter() - started, "ctranslate2": ctranslate2.__version__}


# ---- our engine over HTTP -------------------------------------------------------------------
def load_requests(rows: Sequence[dict[str, Any]]) -> list[Any]:
    from aieng_core.loadgen.http_load import LoadRequest

    return [LoadRequest(row["text"], len(row["ids"]), row["max_new_tokens"]) for row in rows]


def measured_run(server: Any, run: Callable[[], list[Any]], slo: dict[str, float]) -> dict[str, Any]:
    """run() against `server` (a ServerProcess): its summary (loadgen/stats.py) with the CPU
    seconds the server and this process (the load client) took; any failed request fails it."""
    from aieng_core.loadgen.stats import summarize

    server_cpu, client_cpu = server.cpu_seconds(), time.process_time()
    records = run()
    summary = summarize(records, slo)
    summary["server_cpu_seconds"] = server.cpu_seconds() - server_cpu
    summary["client_cpu_seconds"] = time.process_time() - client_cpu
    if summary["failed"]:
        # The server's log first, the failure last: a caller shows the tail of this message.
        raise RuntimeError(
            f"server log tail:\n{server.log_tail(2000)}\n{summary['failed']} of {summary['requests']} "
            f"requests failed: {summary['errors']}"
        )
    return summary


def http(plan: dict[str, Any]) -> dict[str, Any]:
    """A fresh `aieng serve`, warmed, then the 16 mixed requests and the metrics sweep."""
    from dataclasses import replace

    from aieng_core.loadgen.http_load import closed_loop, poisson
    from aieng_core.loadgen.server_process import ServerProcess
    from aieng_core.loadgen.stats import RequestRecord

    info = {"pid": os.getpid(), "load_average_1min": os.getloadavg()[0]}
    slo = plan["slo_ms"]
    mixed, sweep = load_requests(plan["mixed"]), load_requests(plan["sweep_requests"])
    log_path = Path(plan["work_dir"]) / f"server-{os.getpid()}.log"

    with ServerProcess(Path(plan["bundle_dir"]), log_path, {**os.environ, **plan["server_env"]}) as server:

        def measured(run: Callable[[], list[RequestRecord]]) -> dict[str, Any]:
            return measured_run(server, run, slo)

        # Warmup beyond the server's own: every prompt shape once, streamed and not.
        warm = [replace(r, max_tokens=WARMUP_NEW_TOKENS) for r in mixed]
        measured(lambda: closed_loop(server.port, warm, len(warm), stream=True))
        measured(lambda: closed_loop(server.port, warm, len(warm), stream=False))

        figures: dict[str, Any] = {"ready_seconds": server.ready_seconds, "server_pid": server.pid}
        # Like the in-process peers it is compared with: whole responses, not streamed.
        figures["mixed_concurrent"] = measured(lambda: closed_loop(server.port, mixed, len(mixed), stream=False))
        # The in-process single-stream and largest-batch workloads, over HTTP: one client sending
        # the single-stream prompts one after another, and one client per prompt of the batch.
        single, batch = load_requests(plan["single_stream_requests"]), load_requests(plan["largest_batch_requests"])
        figures["in_process_workloads"] = {
            f"{name}_{'stream' if stream else 'no_stream'}": measured(
                partial(closed_loop, server.port, requests, concurrency, stream=stream)
            )
            for name, requests, concurrency in (("single_stream", single, 1), ("largest_batch", batch, len(batch)))
            for stream in (False, True)
        }
        by_concurrency = {}
        for concurrency in plan["concurrencies"]:
            requests = sweep[: plan["requests_per_concurrency"][str(concurrency)]]
            by_concurrency[str(concurrency)] = measured(
                partial(closed_loop, server.port, requests, concurrency, stream=True)
            )
        by_rate = {}
        for rate in plan["poisson_rates"]:
            requests = sweep[: plan["poisson_requests"]]
            by_rate[str(rate)] = measured(
                partial(poisson, server.port, requests, rate, plan["poisson_seed"], stream=True)
            )
        figures["sweep"] = {"concurrency": by_concurrency, "poisson_rate": by_rate}
        figures["server_exit_code"] = server.stop()
    return {**info, **figures}

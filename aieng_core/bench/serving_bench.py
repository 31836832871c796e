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
E2EL, throughput, goodput; serving_stats.py) at several concurrencies and Poisson rates;
(5) achieved FLOP/s at batch 64 as a fraction of this machine's torch.matmul peak. A profile
of our decode step (serving_profile.py) says what bounds each figure.

The config comes from `config`, else $AIENG_CONFIG, else configs/pipeline.yaml; `quick`
shrinks every workload (one round, a few tokens) for a seconds-fast smoke test.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from aieng_core import asset_keys
from aieng_core.config import AiengConfig, load_config, resolve_config_path
from aieng_core.loadgen.stats import METRIC_DEFINITIONS

SEED = 1234  # the random weights
POISSON_SEED = 7
PEERS = ("ours", "transformers", "ctranslate2", "http")

# SLOs for goodput: an interactive stream (first token within half a second, then at least
# 20 tokens/s, a fast reader's pace several times over).
SLO_MS = {"ttft": 500.0, "tpot": 50.0}

GOALS = {
    "single_stream_vs_transformers": 3.0,
    "batch_1_vs_ctranslate2": 0.5,
    "batch_16_vs_ctranslate2": 1.0,
    "batch_64_vs_ctranslate2": 1.5,
    "http_16_clients_vs_transformers_sequential": 8.0,
    "http_16_clients_vs_transformers_static_batch": 2.0,
    "http_16_clients_vs_ctranslate2_batch": 0.8,
    "flops_fraction_of_matmul_peak_at_batch_64": 0.4,
}


@dataclass(frozen=True)
class Sizes:
    threads: int  # per process: torch, CTranslate2 intra_threads, OMP_NUM_THREADS, the server
    new_tokens: int  # per request in the single-stream and batch figures
    prompt_lengths: tuple[int, ...]  # cycled over the requests of every workload
    single_stream_prompts: int
    batches: tuple[int, ...]
    mixed_new_tokens: tuple[int, ...]  # the 16 requests of the HTTP figure
    concurrencies: tuple[int, ...]
    requests_per_concurrency: tuple[int, ...]
    poisson_rates: tuple[float, ...]
    poisson_requests: int
    sweep_new_tokens: tuple[int, ...]
    matmul_sizes: tuple[int, ...]
    profile_batches: tuple[int, ...]
    worker_timeout_s: int


FULL = Sizes(
    threads=2,
    new_tokens=64,
    prompt_lengths=(8, 16, 24, 32, 48, 64, 96, 128),
    single_stream_prompts=8,
    batches=(16, 64),
    # 16..240: prompt + output must fit max_context (256), so the longest output gets a 16-token prompt.
    mixed_new_tokens=(16, 240, 32, 224, 48, 208, 64, 192, 80, 176, 96, 160, 112, 144, 128, 128),
    concurrencies=(1, 4, 16, 64),
    requests_per_concurrency=(8, 16, 32, 128),
    poisson_rates=(4.0, 16.0, 64.0),
    poisson_requests=32,
    sweep_new_tokens=(32, 64, 128, 64),
    matmul_sizes=(256, 512, 1024, 2048),
    profile_batches=(1, 16, 64),
    worker_timeout_s=900,
)
QUICK = Sizes(
    # One thread: on a machine busy with other work, two-thread OpenMP regions wait on each
    # other's descheduled thread and a tiny run takes ten times longer; speed is not judged here.
    threads=1,
    new_tokens=4,
    prompt_lengths=(3, 5, 8, 12),
    single_stream_prompts=2,
    batches=(16, 64),
    mixed_new_tokens=(2, 8, 4, 6) * 4,
    concurrencies=(1, 4, 16, 64),
    requests_per_concurrency=(2, 4, 16, 64),
    poisson_rates=(200.0,),
    poisson_requests=8,
    sweep_new_tokens=(4, 8),
    matmul_sizes=(64, 128),
    profile_batches=(1, 64),
    worker_timeout_s=300,
)


# ---- preparation: tokenizer, weights, artifacts, bundle, prompts --------------------------------
def _prompts(tokenizer: Any, lengths: Sequence[int], eos: int) -> list[dict[str, Any]]:
    """Demo-text prompts of exactly these token lengths, each a text that encodes back to the
    same ids (so the server, given text, runs the very ids the in-process peers run)."""
    from aieng_core.data.demo_data import corpus

    def documents() -> Iterator[str]:
        while True:
            yield from (doc.text for doc in corpus())

    texts, found = documents(), []
    for length in lengths:
        for _ in range(10_000):
            ids = tokenizer.encode(next(texts), add_special_tokens=False).ids[:length]
            text = tokenizer.decode(ids)
            if len(ids) == length and eos not in ids and tokenizer.encode(text, add_special_tokens=False).ids == ids:
                found.append({"text": text, "ids": ids})
                break
        else:
            raise RuntimeError(f"no demo text gives a clean {length}-token prompt")
    return found


def _cycle(values: Sequence[int], count: int) -> list[int]:
    return [values[i % len(values)] for i in range(count)]


def _model_artifact(store: Any, settings: AiengConfig, tokenizer: Any, tokenizer_config: Any) -> Any:
    """A randomly initialised model of the configured shape, published as a model_checkpoint."""
    import torch

    from aieng_core.hashing import sha256_file, sha256_json
    from aieng_core.model.hf_files import save_model_dir
    from aieng_core.model.llama import LlamaConfig, LlamaForCausalLM
    from aieng_core.store import ArtifactSpec, Produced
    from aieng_core.tokenizer.bpe import TOKENIZER_FILES, save_tokenizer_dir, special_token_id

    eos = special_token_id(tokenizer, tokenizer_config.eos_token)
    config = LlamaConfig(
        vocab_size=tokenizer_config.vocab_size,
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=special_token_id(tokenizer, tokenizer_config.pad_token),
        **settings.model.model_dump(),
    )

    def produce(staging: Path) -> Produced:
        torch.manual_seed(SEED)
        model = LlamaForCausalLM(config)
        save_model_dir(model, staging)
        save_tokenizer_dir(tokenizer, staging, tokenizer_config)
        names = ("model.safetensors", "config.json", "generation_config.json", *TOKENIZER_FILES)
        content = {name: sha256_file(staging / name) for name in names}
        metrics = {"parameters": model.num_parameters(), "partial": False, "random_init_seed": SEED}
        return Produced(content_sha256=sha256_json(content), metrics=metrics)

    spec = ArtifactSpec(
        kind=asset_keys.MODEL_CHECKPOINT,
        code_version="serving-bench-random-init-v1",
        config_sha256=settings.section_sha256("model", "tokenizer"),
        recipe={"init": "random", "seed": SEED},
    )
    return store.build(spec, produce)


def _bundle(store: Any, model: Any, settings: AiengConfig, sizes: Sizes) -> Any:
    from aieng_core.bundle.serving_bundle import CODE_VERSION, produce_bundle_files
    from aieng_core.hashing import sha256_json
    from aieng_core.store import ArtifactSpec

    # The configured serving section, with room for the largest batch and the whole sweep queued.
    serving = settings.serving.model_copy(
        update={
            "max_batch": max(settings.serving.max_batch, *sizes.batches, *sizes.concurrencies),
            # Every request of the largest load may wait at once, twice over: no 429 in a benchmark.
            "max_waiting": max(
                settings.serving.max_waiting, 2 * max(*sizes.requests_per_concurrency, sizes.poisson_requests)
            ),
            "threads": sizes.threads,
            "device": "cpu",
        }
    )
    spec = ArtifactSpec(
        kind=asset_keys.SERVING_BUNDLE,
        code_version=CODE_VERSION,
        config_sha256=sha256_json(serving.model_dump(mode="json")),
        inputs=((asset_keys.MODEL_CHECKPOINT, model.id),),
        recipe={"device": "cpu", "threads": sizes.threads},
    )
    return store.build(spec, lambda staging: produce_bundle_files(staging, model, serving, sizes.threads)), serving


def _prepare(work: Path, settings: AiengConfig, sizes: Sizes) -> dict[str, Any]:
    from aieng_core.data.demo_data import corpus
    from aieng_core.store import ArtifactStore
    from aieng_core.tokenizer.bpe import special_token_id, train_bpe

    home = work / "home"
    store = ArtifactStore(home)
    tokenizer = train_bpe((doc.text for doc in corpus()), settings.tokenizer)
    model = _model_artifact(store, settings, tokenizer, settings.tokenizer)
    bundle, serving = _bundle(store, model, settings, sizes)
    # The server takes its behaviour under load (max_waiting, timeouts, threads) from its
    # config, not from the bundle: it gets the configured file with this serving section.
    server_config = work / "server-config.yaml"
    server_config.write_text(
        yaml.safe_dump({**settings.model_dump(mode="json"), "serving": serving.model_dump(mode="json")}),
        encoding="utf-8",
    )
    load_config(server_config)  # the file must load as any config does
    eos = special_token_id(tokenizer, settings.tokenizer.eos_token)
    context = serving.max_context

    lengths = sizes.prompt_lengths
    single = _prompts(tokenizer, _cycle(lengths, sizes.single_stream_prompts), eos)
    batches = {str(size): _prompts(tokenizer, _cycle(lengths, size), eos) for size in sizes.batches}
    mixed_lengths = [min(lengths[i % len(lengths)], context - new) for i, new in enumerate(sizes.mixed_new_tokens)]
    mixed = _prompts(tokenizer, mixed_lengths, eos)
    for row, new in zip(mixed, sizes.mixed_new_tokens):
        row["max_new_tokens"] = new
    sweep_count = max(*sizes.requests_per_concurrency, sizes.poisson_requests)
    sweep_new = _cycle(sizes.sweep_new_tokens, sweep_count)
    sweep = _prompts(tokenizer, [min(n, context - new) for n, new in zip(_cycle(lengths, sweep_count), sweep_new)], eos)
    for row, new in zip(sweep, sweep_new):
        row["max_new_tokens"] = new
    return {
        "work_dir": str(work),
        "model_dir": str(model.path),
        "ct2_dir": str(work / "ctranslate2"),
        "bundle_dir": str(bundle.path),
        "bundle_id": bundle.id,
        "threads": sizes.threads,
        "eos_token_id": eos,
        "pad_token_id": special_token_id(tokenizer, settings.tokenizer.pad_token),
        "parameters": model.metrics["parameters"],
        "model_config": json.loads((model.path / "config.json").read_text(encoding="utf-8")),
        "limits": {
            "max_batch": serving.max_batch,
            "max_context": serving.max_context,
            "max_waiting": serving.max_waiting,
            "max_prefill_tokens": serving.max_prefill_tokens,
        },
        "warmup_prompt_lengths": list(serving.warmup_prompt_lengths),
        "new_tokens": sizes.new_tokens,
        "single_stream_prompts": [p["ids"] for p in single],
        "batch_prompts": {size: [p["ids"] for p in prompts] for size, prompts in batches.items()},
        "mixed": mixed,
        "sweep_requests": sweep,
        "concurrencies": list(sizes.concurrencies),
        "requests_per_concurrency": {str(c): n for c, n in zip(sizes.concurrencies, sizes.requests_per_concurrency)},
        "poisson_rates": list(sizes.poisson_rates),
        "poisson_requests": sizes.poisson_requests,
        "poisson_seed": POISSON_SEED,
        "slo_ms": SLO_MS,
        "matmul_sizes": list(sizes.matmul_sizes),
        "profile_batches": list(sizes.profile_batches),
        "server_env": {
            "AIENG_HOME": str(home),
            "AIENG_CONFIG": str(server_config),
            "OMP_NUM_THREADS": str(sizes.threads),
        },
    }


# ---- running the workers ----------------------------------------------------------------------
def _run_worker(name: str, plan_path: Path, env: dict[str, str], timeout: int) -> dict[str, Any]:
    command = [sys.executable, "-m", "aieng_core.bench.serving_bench", "--worker", name, str(plan_path)]
    started = time.perf_counter()
    # A session of its own, so a timeout stops the worker and anything it started (the server).
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise RuntimeError(f"serving benchmark worker {name!r} ran past {timeout} s and was stopped") from None
    except BaseException:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise
    if process.returncode != 0:
        raise RuntimeError(f"serving benchmark worker {name!r} failed (exit {process.returncode}):\n{stderr[-4000:]}")
    return {**json.loads(stdout.strip().splitlines()[-1]), "process_wall_seconds": time.perf_counter() - started}


# ---- the report -------------------------------------------------------------------------------
def spread(values: Sequence[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "rounds": list(values)}


def _spread_tree(trees: Sequence[Any]) -> Any:
    """Numbers -> their spread over the rounds; dicts recursively; anything else from round 0."""
    first = trees[0]
    if isinstance(first, bool) or first is None or isinstance(first, (str, list)):
        return first
    if isinstance(first, (int, float)):
        return spread([float(t) for t in trees])
    return {key: _spread_tree([t[key] for t in trees]) for key in first}


def _peer_figure(rounds: list[dict[str, Any]], peer: str, workload: str, key: str = "tokens_per_second") -> dict:
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


def _goal(name: str, ours: float, peer: float) -> dict[str, Any]:
    ratio = ours / peer
    return {"ratio": ratio, "target": GOALS[name], "met": ratio >= GOALS[name]}


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
            f"{p['attention_padding_share']:.0%} of attended positions; prefill of the batch's {size} prompt(s) took "
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


def _report(plan: dict[str, Any], rounds: list[dict[str, Any]], profile: dict[str, Any]) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    single = {peer: _peer_figure(rounds, peer, "single_stream") for peer in ("ours", "transformers", "ctranslate2")}
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
            peer: _peer_figure(rounds, peer, f"batch_{size}") for peer in ("ours", "ctranslate2", "transformers")
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
        "ours_in_process": _peer_figure(rounds, "ours", "mixed_batch"),
        "transformers_sequential": _peer_figure(rounds, "transformers", "mixed_sequential"),
        "transformers_static_batch": {
            **_peer_figure(rounds, "transformers", "mixed_static_batch"),
            "tokens_computed": rounds[0]["transformers"]["workloads"]["mixed_static_batch"]["tokens_computed"],
        },
        "ctranslate2_batch": _peer_figure(rounds, "ctranslate2", "mixed_batch"),
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
        **_spread_tree([record["http"]["sweep"] for record in rounds]),
    }
    figures["flops_at_batch_64"] = _flops(plan, rounds, max(int(size) for size in plan["batch_prompts"]))
    peak = figures["flops_at_batch_64"]["matmul_peak_gflops"]["median"]

    def median(figure: dict[str, Any]) -> float:
        return float(figure["median"])

    http = figures["http_16_clients_mixed"]
    goals = {
        "single_stream_vs_transformers": _goal(
            "single_stream_vs_transformers", median(single["ours"]), median(single["transformers"])
        ),
        **{
            f"batch_{size}_vs_ctranslate2": _goal(
                f"batch_{size}_vs_ctranslate2",
                median(batch_figures[size]["ours"]),
                median(batch_figures[size]["ctranslate2"]),
            )
            for size in ("1", "16", "64")
            if size in batch_figures
        },
        "http_16_clients_vs_transformers_sequential": _goal(
            "http_16_clients_vs_transformers_sequential",
            median(http["ours_http"]),
            median(http["transformers_sequential"]),
        ),
        "http_16_clients_vs_transformers_static_batch": _goal(
            "http_16_clients_vs_transformers_static_batch",
            median(http["ours_http"]),
            median(http["transformers_static_batch"]),
        ),
        "http_16_clients_vs_ctranslate2_batch": _goal(
            "http_16_clients_vs_ctranslate2_batch", median(http["ours_http"]), median(http["ctranslate2_batch"])
        ),
    }
    fraction = figures["flops_at_batch_64"]["fraction_of_peak"]["median"]
    goals["flops_fraction_of_matmul_peak_at_batch_64"] = {
        "ratio": fraction,
        "target": GOALS["flops_fraction_of_matmul_peak_at_batch_64"],
        "met": fraction >= GOALS["flops_fraction_of_matmul_peak_at_batch_64"],
    }
    return {"figures": figures, "goals": goals, "bounds": _bounds(figures, goals, profile, peak)}


def run_serving_bench(
    out: str | None = None, config: str | None = None, quick: bool = False, rounds: int = 3
) -> dict[str, Any]:
    if rounds < 1:
        raise ValueError("rounds must be at least 1")
    import torch

    settings = load_config(config)
    config_path = resolve_config_path(config)
    sizes = QUICK if quick else FULL
    rounds = 1 if quick else rounds
    started = dt.datetime.now(dt.UTC)
    load_at_start = os.getloadavg()
    work = Path(tempfile.mkdtemp(prefix="aieng-serving-bench-"))
    try:
        plan = _prepare(work, settings, sizes)
        plan_path = work / "plan.json"
        plan_path.write_text(json.dumps(plan), encoding="utf-8")
        env = {**os.environ, **plan["server_env"]}
        conversion = _run_worker("convert", plan_path, env, sizes.worker_timeout_s)
        round_records: list[dict[str, Any]] = []
        for index in range(rounds):
            # Alternate who goes first, so drift in machine load over the run favours no peer.
            order = list(PEERS) if index % 2 == 0 else list(reversed(PEERS))
            record: dict[str, Any] = {"round": index, "order": order}
            for peer in order:
                record[peer] = _run_worker(peer, plan_path, env, sizes.worker_timeout_s)
            round_records.append(record)
        profile = _run_worker("profile", plan_path, env, sizes.worker_timeout_s)
        report = _report(plan, round_records, profile)
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
    }
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(results, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return results


def _version(module: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(module)
    except PackageNotFoundError:
        return None


# ---- text output ------------------------------------------------------------------------------
def _fig(figure: dict[str, Any], unit: str = "tok/s") -> str:
    return f"{figure['median']:,.0f} {unit} ({figure['min']:,.0f}-{figure['max']:,.0f})"


def format_serving_results(results: dict[str, Any]) -> str:
    figures, goals = results["figures"], results["goals"]
    rounds = results["method"]["rounds"]
    load = results["machine"]["load_average_at_start"]
    single = figures["single_stream"]
    lines = [
        f"model            {results['model']['parameters']:,} parameters, {results['machine']['threads']} threads, "
        f"medians of {rounds} round(s) (min-max); 1-min load average at start {load[0]:.2f}",
        f"single stream    ours {_fig(single['ours'])} | transformers {_fig(single['transformers'])} | "
        f"CTranslate2 {_fig(single['ctranslate2'])}",
    ]
    for size, figure in figures["batch_vs_ctranslate2"].items():
        if isinstance(figure, dict) and "ours" in figure and size != "1":
            lines.append(
                f"batch {size:<10} ours {_fig(figure['ours'])} | CTranslate2 {_fig(figure['ctranslate2'])} | "
                f"transformers {_fig(figure['transformers'])}"
            )
    http = figures["http_16_clients_mixed"]
    lines.append(
        f"16 HTTP clients  ours {_fig(http['ours_http'])} (in-process {_fig(http['ours_in_process'])}) | "
        f"transformers one at a time {_fig(http['transformers_sequential'])}, static batch "
        f"{_fig(http['transformers_static_batch'])} | CTranslate2 batch {_fig(http['ctranslate2_batch'])}"
    )
    metrics = figures["serving_metrics"]
    for kind, label in (("concurrency", "concurrency"), ("poisson_rate", "rate")):
        for key, m in metrics[kind].items():
            ttft = m["ttft_ms"]
            lines.append(
                f"{label} {key:<9}   TTFT p50/p99 {ttft['p50']['median']:.0f}/{ttft['p99']['median']:.0f} ms, "
                f"TPOT p50 {m['tpot_ms']['p50']['median']:.1f} ms, ITL p99 {m['itl_ms']['p99']['median']:.1f} ms, "
                f"E2EL p50 {m['e2el_ms']['p50']['median']:.0f} ms, {m['output_throughput']['median']:,.0f} tok/s, "
                f"{m['request_throughput']['median']:.1f} req/s, goodput {m['goodput']['median']:.1f} req/s"
            )
    flops = figures["flops_at_batch_64"]
    lines.append(
        f"FLOP/s batch 64  {flops['achieved_gflops']['median']:.1f} GFLOP/s of a "
        f"{flops['matmul_peak_gflops']['median']:.0f} GFLOP/s matmul peak ({flops['fraction_of_peak']['median']:.0%})"
    )
    lines.append("goals:")
    for name, goal in goals.items():
        lines.append(
            f"  {name:<48} {goal['ratio']:>7.2f} (target >= {goal['target']}) {'met' if goal['met'] else 'MISSED'}"
        )
    if results["bounds"]:
        lines.append("bounds:")
        lines.extend(f"  - {note}" for note in results["bounds"])
    return "\n".join(lines)


# ---- worker entry point -----------------------------------------------------------------------
def _workers() -> dict[str, Callable[[dict[str, Any]], dict[str, Any]]]:
    from aieng_core.bench import serving_profile, serving_workers

    return {
        "convert": serving_workers.convert,
        "ours": serving_workers.ours,
        "transformers": serving_workers.transformers_peer,
        "ctranslate2": serving_workers.ctranslate2_peer,
        "http": serving_workers.http,
        "profile": serving_profile.profile,
    }


def main(argv: list[str] | None = None) -> int:
    """One worker of the serving benchmark (run by run_serving_bench in a fresh process)."""
    parser = argparse.ArgumentParser(prog="python -m aieng_core.bench.serving_bench")
    parser.add_argument(
        "--worker", required=True, choices=("convert", "ours", "transformers", "ctranslate2", "http", "profile")
    )
    parser.add_argument("plan", type=Path, help="plan.json written by run_serving_bench")
    args = parser.parse_args(argv)
    plan = json.loads(args.plan.read_text(encoding="utf-8"))
    print(json.dumps(_workers()[args.worker](plan)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

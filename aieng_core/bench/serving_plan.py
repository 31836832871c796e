"""What the serving benchmark runs: the sizes of its workloads, and the plan it writes for its
workers (serving_workers.py) before any of them starts.

Same weights: the configured model shape, randomly initialised with a fixed seed and saved
once as safetensors (a model_checkpoint in a home of the run's own), with a serving bundle of
it. Same prompts: real demo text cut to mixed lengths, given to every in-process peer as the
same token ids and to the server as text that encodes to exactly those ids.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from aieng_core import asset_keys
from aieng_core.config import AiengConfig, load_config
from aieng_core.loadgen.http_load import REQUEST_TIMEOUT_S

SEED = 1234  # the random weights
POISSON_SEED = 7
# The int8 peers run the single-stream and batch workloads: ours on the int8 variant of the same
# weights (model/int8_weights.py), CTranslate2 with compute_type int8 on the same conversion.
PEERS = ("ours", "transformers", "ctranslate2", "ours_int8", "ctranslate2_int8", "http")
# The contention workload (serving_contention.py): our server, the spin-waiting baseline server
# (serving.adapt_threads false) and CTranslate2, each alone and beside one busy process, each
# condition a fresh process of its own, in rounds of their own.
CONTENTION_PEERS = tuple(
    f"contention_{peer}_{condition}" for peer in ("ours", "baseline", "ctranslate2") for condition in ("alone", "busy")
)

# SLOs for goodput: an interactive stream (first token within half a second, then at least
# 20 tokens/s, a fast reader's pace several times over).
SLO_MS = {"ttft": 500.0, "tpot": 50.0}


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
def prompts_of_lengths(tokenizer: Any, lengths: Sequence[int], eos: int, skip: int = 0) -> list[dict[str, Any]]:
    """Demo-text prompts of exactly these token lengths, each a text that encodes back to the
    same ids (so the server, given text, runs the very ids the in-process peers run), each
    from the next demo document, the first `skip` left out."""
    from aieng_core.data.demo_data import corpus

    def documents() -> Iterator[str]:
        while True:
            yield from (doc.text for doc in corpus())

    texts, found = documents(), []
    for _ in range(skip):
        next(texts)
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

    # The configured recipe, with room for the largest batch; the configured server settings,
    # with the whole sweep allowed to wait (twice over: no 429 in a benchmark), and no prefix
    # cache: every HTTP workload is warmed up with its own prompts first, which a cache would
    # answer from memory where the in-process peers prefill (`aieng bench prefix` measures it).
    # No 504 either: beside a busy process the spin-waiting baseline (the contention workload)
    # may run a hundred times slower, and its 16 requests then take most of a minute; the load
    # client gives each request REQUEST_TIMEOUT_S.
    recipe = settings.bundle.model_copy(
        update={"max_batch": max(settings.bundle.max_batch, *sizes.batches, *sizes.concurrencies)}
    )
    serving = settings.serving.model_copy(
        update={
            "max_waiting": max(
                settings.serving.max_waiting, 2 * max(*sizes.requests_per_concurrency, sizes.poisson_requests)
            ),
            "request_timeout_s": max(settings.serving.request_timeout_s, REQUEST_TIMEOUT_S),
            "threads": sizes.threads,
            "device": "cpu",
            "prefix_cache_tokens": 0,
        }
    )
    spec = ArtifactSpec(
        kind=asset_keys.SERVING_BUNDLE,
        code_version=CODE_VERSION,
        config_sha256=sha256_json(recipe.model_dump(mode="json")),
        inputs=((asset_keys.MODEL_CHECKPOINT, model.id),),
        recipe={"device": "cpu", "threads": sizes.threads},
    )
    bundle = store.build(spec, lambda staging: produce_bundle_files(staging, model, recipe, sizes.threads))
    return bundle, recipe, serving


def _server_config(path: Path, settings: AiengConfig, recipe: Any, serving: Any) -> Path:
    """The configured file with the bench's bundle recipe and this serving section, at `path`."""
    config = {
        **settings.model_dump(mode="json"),
        "bundle": recipe.model_dump(mode="json"),
        "serving": serving.model_dump(mode="json"),
    }
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    load_config(path)  # the file must load as any config does
    return path


def prepare(work: Path, settings: AiengConfig, sizes: Sizes) -> dict[str, Any]:
    from aieng_core.data.demo_data import corpus
    from aieng_core.store import ArtifactStore
    from aieng_core.tokenizer.bpe import special_token_id, train_bpe

    home = work / "home"
    store = ArtifactStore(home)
    tokenizer = train_bpe((doc.text for doc in corpus()), settings.tokenizer)
    model = _model_artifact(store, settings, tokenizer, settings.tokenizer)
    bundle, recipe, serving = _bundle(store, model, settings, sizes)
    # The server takes its behaviour under load (max_waiting, timeouts, threads) from its
    # config, not from the bundle: it gets the configured file with this serving section.
    server_config = _server_config(work / "server-config.yaml", settings, recipe, serving)
    # The contention workload's baseline: the same server stepping at serving.threads always,
    # whatever other processes take (serving.adapt_threads false), as it did before it adapted.
    baseline_serving = serving.model_copy(update={"adapt_threads": False, "threads": sizes.threads})
    baseline_config = _server_config(work / "server-config-baseline.yaml", settings, recipe, baseline_serving)
    eos = special_token_id(tokenizer, settings.tokenizer.eos_token)
    context = recipe.max_context

    lengths = sizes.prompt_lengths
    single = prompts_of_lengths(tokenizer, _cycle(lengths, sizes.single_stream_prompts), eos)
    batches = {str(size): prompts_of_lengths(tokenizer, _cycle(lengths, size), eos) for size in sizes.batches}
    mixed_lengths = [min(lengths[i % len(lengths)], context - new) for i, new in enumerate(sizes.mixed_new_tokens)]
    mixed = prompts_of_lengths(tokenizer, mixed_lengths, eos)
    for row, new in zip(mixed, sizes.mixed_new_tokens):
        row["max_new_tokens"] = new
    sweep_count = max(*sizes.requests_per_concurrency, sizes.poisson_requests)
    sweep_new = _cycle(sizes.sweep_new_tokens, sweep_count)
    sweep_lengths = [min(n, context - new) for n, new in zip(_cycle(lengths, sweep_count), sweep_new)]
    sweep = prompts_of_lengths(tokenizer, sweep_lengths, eos)
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
            "max_batch": recipe.max_batch,
            "max_context": recipe.max_context,
            "max_waiting": serving.max_waiting,
            "max_prefill_tokens": recipe.max_prefill_tokens,
        },
        "warmup_prompt_lengths": list(serving.warmup_prompt_lengths),
        "new_tokens": sizes.new_tokens,
        "single_stream_prompts": [p["ids"] for p in single],
        # The same prompts as text, for the HTTP client's runs of the in-process workloads.
        "single_stream_requests": [{**p, "max_new_tokens": sizes.new_tokens} for p in single],
        "largest_batch_requests": [{**p, "max_new_tokens": sizes.new_tokens} for p in batches[str(max(sizes.batches))]],
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
        "contention_servers": {
            "ours": {"config": str(server_config), "adapt_threads": serving.adapt_threads, "threads": serving.threads},
            "baseline": {"config": str(baseline_config), "adapt_threads": False, "threads": sizes.threads},
        },
        "server_env": {
            "AIENG_HOME": str(home),
            "AIENG_CONFIG": str(server_config),
            "OMP_NUM_THREADS": str(sizes.threads),
        },
    }

"""The CUDA path, checked on a machine with a GPU (CI has none): load a serving bundle on
cuda, warm it up, replay its goldens, and measure generation throughput of one peer.

    python scripts/cuda_check.py BUNDLE_DIR --peer ours|transformers --out FIGURES.json

One peer per process: run it once per peer, alternating the order, and compare the medians
(a peer sharing a process with another can run much slower; NOTES.md). Greedy, ignore_eos,
the same prompts of the same length for both peers, warmed up before timing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from aieng_core.benchmark.speed import (
    benchmark_prompts,
    engine_generate,
    load_transformers_model,
    transformers_generate,
)
from aieng_core.bundle.verify import load_bundle
from aieng_core.config import load_config
from aieng_core.gate.warmup import warmup_step
from aieng_core.serving.engine import Engine, EngineLimits
from aieng_core.serving.request import SamplingParams

BATCH_SIZES = (1, 16, 64)
NEW_TOKENS = 64
PROMPT_TOKENS = 16
REPEATS = 5
CONFIG = Path(__file__).resolve().parents[1] / "configs" / "pipeline.yaml"


def _synchronized(fn: Any, device: str) -> Any:
    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    def timed(*args: Any) -> tuple[Any, float]:
        sync()
        started = time.perf_counter()
        result = fn(*args)
        sync()
        return result, time.perf_counter() - started

    return timed


def measure(peer: str, bundle_dir: Path, device: str) -> dict[str, Any]:
    on_cuda = device.startswith("cuda")
    name = torch.cuda.get_device_name(0) if on_cuda else "cpu"
    figures: dict[str, Any] = {"peer": peer, "device": name, "torch": torch.__version__}
    started = time.perf_counter()
    bundle = load_bundle(bundle_dir, device=device, check_goldens=False)
    figures["load_seconds"] = time.perf_counter() - started
    limits = EngineLimits(
        max_batch=max(BATCH_SIZES),
        max_context=PROMPT_TOKENS + NEW_TOKENS,
        max_waiting=1024,
        max_prefill_tokens=max(BATCH_SIZES) * PROMPT_TOKENS,
    )
    engine = Engine(bundle.model, bundle.tokenizer, limits, bundle.eos_token_id)
    if peer == "ours":
        # Goldens were recorded on CPU; on cuda a near-tie may pick another token, so count, don't assert.
        outputs = engine.generate(
            [g["prompt_ids"] for g in bundle.golden],
            [SamplingParams(max_new_tokens=int(g["max_new_tokens"]), ignore_eos=True) for g in bundle.golden],
        )
        figures["goldens_equal"] = sum(
            list(o.token_ids) == list(g["token_ids"]) for o, g in zip(outputs, bundle.golden, strict=True)
        )
        figures["goldens"] = len(bundle.golden)
        started = time.perf_counter()
        figures["warmup"] = engine.warmup([8, 16, 32, 64])
        figures["warmup_seconds"] = time.perf_counter() - started
        # The gate's warmup step, as production_deployment runs it with serving.device: cuda.
        config = load_config(CONFIG)
        config = config.model_copy(update={"serving": config.serving.model_copy(update={"device": device})})
        figures["gate_warmup"] = warmup_step(bundle_dir, config)
        generate = engine_generate(engine)
    else:
        generate = transformers_generate(load_transformers_model(bundle.path).to(device), bundle.eos_token_id)

    timed = _synchronized(generate, device)
    figures["batches"] = {}
    for size in BATCH_SIZES:
        prompts = benchmark_prompts(engine.encode, bundle.eos_token_id, size, PROMPT_TOKENS)
        timed(prompts, 4)  # warm: allocations and kernels of this shape
        rates = []
        for _ in range(REPEATS):
            generated, seconds = timed(prompts, NEW_TOKENS)
            if [len(ids) for ids in generated] != [NEW_TOKENS] * size:
                raise RuntimeError(f"{peer} did not generate {NEW_TOKENS} tokens for every request")
            rates.append(size * NEW_TOKENS / seconds)
        figures["batches"][str(size)] = {
            "tokens_per_second": statistics.median(rates),
            "min": min(rates),
            "max": max(rates),
            "runs": rates,
        }
    if on_cuda:
        figures["cuda_max_memory_allocated_bytes"] = int(torch.cuda.max_memory_allocated())
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--peer", choices=["ours", "transformers"], required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda", help="cpu only to try the script itself")
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("cuda_check: no CUDA device is visible to torch")
    figures = measure(args.peer, args.bundle, args.device)
    args.out.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({k: v for k, v in figures.items() if k != "warmup"}, indent=2))


if __name__ == "__main__":
    main()

"""Inter-token latency of running streams while a long prompt arrives, with the prompt prefilled
whole (max_prefill_tokens >= its length: the engine before chunked prefill) and in chunks.

On the pipeline model's shape (random weights, configs/pipeline.yaml, max_context 256):
8 streams decode (32-token prompts); after 10 steps a 240-token prompt arrives; every step
from its arrival until 40 steps later is one inter-token gap of every stream. Each budget runs
in a fresh process of its own, the order alternated, ROUNDS rounds; decode steps eager (the
prefill is eager either way). Reports P50/P99/max ITL per budget, median over rounds.

    .venv/bin/python scripts/chunked_prefill_itl.py [--rounds 3] [--budgets 4096 64 32]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STREAMS, STREAM_PROMPT, LONG_PROMPT, WINDOW = 8, 32, 240, 40


def worker(budget: int, threads: int) -> dict:
    import numpy as np
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from pipeline_shape import pipeline_model

    from aieng_core.serving.engine import Engine, EngineLimits
    from aieng_core.serving.request import SamplingParams

    config, model, tokenizer = pipeline_model(threads)
    limits = EngineLimits(config.bundle.max_batch, config.bundle.max_context, 256, budget)
    engine = Engine(model, tokenizer, limits, 2)
    engine.warmup([8, 32, 128])
    generator = torch.Generator().manual_seed(5)
    vocab = model.config.vocab_size

    def prompt(length: int) -> list[int]:
        return torch.randint(3, vocab, (length,), generator=generator).tolist()

    streams = [
        engine.add_request(f"s{n}", prompt(STREAM_PROMPT), SamplingParams(max_new_tokens=200, ignore_eos=True))
        for n in range(STREAMS)
    ]
    for _ in range(10):
        engine.step()
    engine.add_request("long", prompt(LONG_PROMPT), SamplingParams(max_new_tokens=8, ignore_eos=True))
    gaps, prefill_steps = [], 0
    for _ in range(WINDOW):
        before = [len(s.output_ids) for s in streams]
        started = time.perf_counter()
        engine.step()
        gaps.append((time.perf_counter() - started) * 1000)
        prefill_steps += bool(engine.last_step.prefill_chunks)
        assert [len(s.output_ids) for s in streams] == [n + 1 for n in before]
    values = np.array(gaps)
    return {
        "budget": budget,
        "prefill_steps": prefill_steps,
        "itl_ms": {
            "p50": float(np.percentile(values, 50)),
            "p99": float(np.percentile(values, 99)),
            "max": float(values.max()),
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--budgets", type=int, nargs="+", default=[4096, 64, 32])
    parser.add_argument("--worker", type=int)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.worker is not None:
        print(json.dumps(worker(args.worker, args.threads)))
        return 0
    sys.path.insert(0, str(REPO))
    from pipeline_shape import in_fresh_process, write_result

    from aieng_core.bench.serving_report import spread
    from aieng_core.bench.serving_rounds import run_rounds

    budgets = [str(b) for b in args.budgets]
    rounds = run_rounds(
        budgets, args.rounds, lambda b: in_fresh_process(__file__, "--worker", b, "--threads", str(args.threads))
    )
    for record in rounds:
        figures = ", ".join(f"budget {b}: p99 {record[b]['itl_ms']['p99']:.1f} ms" for b in budgets)
        print(f"round {record['round']}: {figures}", flush=True)
    result = {
        "streams": STREAMS,
        "long_prompt_tokens": LONG_PROMPT,
        "window_steps": WINDOW,
        "budgets": {
            b: {
                "prefill_steps": rounds[0][b]["prefill_steps"],
                **{key: spread([r[b]["itl_ms"][key] for r in rounds]) for key in ("p50", "p99", "max")},
            }
            for b in budgets
        },
    }
    write_result(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

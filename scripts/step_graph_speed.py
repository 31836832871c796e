"""Engine.generate tokens/s with decode steps captured (serving.step_graphs: compile) versus
eager, on the pipeline model's shape (configs/pipeline.yaml: 3.95M parameters with a
4096-token vocabulary, random weights), each side in a fresh process of its own, the order
alternated each round; median and spread of the rounds.

    .venv/bin/python scripts/step_graph_speed.py [--rounds 3] [--out step-graphs.json]

The captured side's warmup compiles in round 0 and loads inductor's disk cache afterwards
(the cache directory is kept in --work); its capture seconds per round are reported too.
The full comparison with the other peers (transformers, CTranslate2, HTTP) is `aieng bench
serving`.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BATCHES = (1, 16, 64)
PROMPT_TOKENS, NEW_TOKENS = 32, 64


def worker(mode: str, work: Path, threads: int) -> dict:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from pipeline_shape import pipeline_model

    from aieng_core.serving.engine import Engine, EngineLimits
    from aieng_core.serving.request import SamplingParams
    from aieng_core.serving.step_graphs import StepGraphSettings

    config, model, tokenizer = pipeline_model(threads)
    model_config = model.config
    bundle = config.bundle
    limits = EngineLimits(bundle.max_batch, bundle.max_context, 256, bundle.max_prefill_tokens)
    graphs = StepGraphSettings(mode=mode, cache_dir=work / "cache")
    engine = Engine(model, tokenizer, limits, 2, graphs, bundle_key="step-graph-speed")
    started = time.perf_counter()
    warmup = engine.warmup([8, 32])
    warmup_seconds = time.perf_counter() - started
    generator = torch.Generator().manual_seed(5)
    figures = {}
    for batch in BATCHES:
        prompts = torch.randint(3, model_config.vocab_size, (batch, PROMPT_TOKENS), generator=generator).tolist()
        params = SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True)
        engine.generate(prompts, SamplingParams(max_new_tokens=2, ignore_eos=True))  # the same shapes, briefly
        began = time.perf_counter()
        outputs = engine.generate(prompts, params)
        seconds = time.perf_counter() - began
        tokens = sum(len(o.token_ids) for o in outputs)
        assert tokens == batch * NEW_TOKENS
        figures[str(batch)] = {"tokens_per_second": tokens / seconds, "outputs": [list(o.token_ids) for o in outputs]}
    return {
        "mode": mode,
        "warmup_seconds": warmup_seconds,
        "step_graphs": warmup["step_graphs"],
        "captured_steps": engine.runner.captured_steps,
        "batches": figures,
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--worker", choices=("eager", "compile"))
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="step-graph-speed-"))
    if args.worker:
        print(json.dumps(worker(args.worker, work, args.threads)))
        return 0
    sys.path.insert(0, str(REPO))
    from pipeline_shape import in_fresh_process, write_result

    from aieng_core.bench.serving_report import spread
    from aieng_core.bench.serving_rounds import run_rounds

    sides = ["eager", "compile"]
    common = ("--work", str(work), "--threads", str(args.threads))
    rounds = run_rounds(sides, args.rounds, lambda mode: in_fresh_process(__file__, "--worker", mode, *common))
    for record in rounds:
        figures = ", ".join(
            f"{mode} b{b} {record[mode]['batches'][b]['tokens_per_second']:.0f}"
            for mode in sides
            for b in map(str, BATCHES)
        )
        print(f"round {record['round']}: {figures}", flush=True)

    result: dict = {"prompt_tokens": PROMPT_TOKENS, "new_tokens": NEW_TOKENS, "threads": args.threads, "batches": {}}
    for batch in map(str, BATCHES):
        eager = [r["eager"]["batches"][batch]["tokens_per_second"] for r in rounds]
        captured = [r["compile"]["batches"][batch]["tokens_per_second"] for r in rounds]
        same = all(r["eager"]["batches"][batch]["outputs"] == r["compile"]["batches"][batch]["outputs"] for r in rounds)
        result["batches"][batch] = {
            "eager_tokens_per_second": spread(eager),
            "captured_tokens_per_second": spread(captured),
            "captured_over_eager": spread([c / e for c, e in zip(captured, eager)]),
            "identical_greedy_outputs": same,
        }
    result["capture_seconds_by_round"] = [r["compile"]["step_graphs"]["capture_seconds"] for r in rounds]
    result["step_graph_buckets_round_0"] = rounds[0]["compile"]["step_graphs"]["buckets"]
    write_result(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

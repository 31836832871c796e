"""The decode step with its attention in groups of rows re-seated by length (the default)
versus one attention over every row up to the longest, both captured, on the pipeline
model's shape (configs/pipeline.yaml, random weights) and the serving benchmark's prompts
(8 to 128 tokens, cycled; 64 new tokens; 2 threads).

    .venv/bin/python scripts/decode_group_speed.py [--rounds 6] [--out decode-groups.json]

Both engines live in one process, so they see the same machine (this VM's speed drifts by a
third between processes): the runs alternate between them, each a whole batch from
admission to the last token. Reported per batch: the median decode-only step (ms) with its
spread, the whole run's seconds, the padded share of the attended positions, and the
requests re-seated. Compiled code is cached in --work, so a second run starts in seconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROMPT_LENGTHS = (8, 16, 24, 32, 48, 64, 96, 128)
BATCHES = (1, 16, 64)
NEW_TOKENS = 64
ONE_GROUP = 1_000_000  # min_group_rows no batch reaches: a single group


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "aieng-decode-groups")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(REPO / "scripts"))
    import torch
    from pipeline_shape import pipeline_model

    from aieng_core.model.decode_attention import MIN_GROUP_ROWS
    from aieng_core.serving.engine import Engine, EngineLimits
    from aieng_core.serving.request import SamplingParams
    from aieng_core.serving.step_graphs import COMPILE, StepGraphSettings

    config, model, tokenizer = pipeline_model(2)
    bundle = config.bundle
    limits = EngineLimits(bundle.max_batch, bundle.max_context, 256, bundle.max_prefill_tokens)
    engines = {}
    for name, min_rows in (("one_group", ONE_GROUP), ("groups", MIN_GROUP_ROWS)):
        settings = StepGraphSettings(mode=COMPILE, cache_dir=args.work / name)
        engine = Engine(model, tokenizer, limits, model.config.eos_token_id, settings, bundle_key=name)
        engine.runner.graphs.min_group_rows = min_rows
        print(name, engine.warmup([8, 32])["step_graphs"]["status"], file=sys.stderr, flush=True)
        engines[name] = engine

    def run(engine: Engine, prompts: list[list[int]]) -> tuple[float, float, float]:
        for index, prompt in enumerate(prompts):
            engine.add_request(f"r{index}", prompt, SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True))
        steps, attended, cells = [], 0, 0
        began = time.perf_counter()
        while engine.has_work:
            started = time.perf_counter()
            engine.step()
            step = engine.last_step
            if step is not None and step.prefill_tokens == 0 and step.decode_tokens:
                steps.append(time.perf_counter() - started)
                attended += engine.runner.last_attention[0]
                cells += engine.runner.last_attention[1]
        return time.perf_counter() - began, statistics.median(steps) * 1000, 1 - attended / cells

    generator = torch.Generator().manual_seed(5)
    results: dict = {"rounds": args.rounds, "new_tokens": NEW_TOKENS, "prompt_lengths": PROMPT_LENGTHS, "batches": {}}
    for batch in BATCHES:
        lengths = [PROMPT_LENGTHS[i % len(PROMPT_LENGTHS)] for i in range(batch)] if batch > 1 else [32]
        prompts = [torch.randint(3, model.config.vocab_size, (n,), generator=generator).tolist() for n in lengths]
        for engine in engines.values():
            run(engine, prompts)  # warm
        runs: dict[str, list] = {name: [] for name in engines}
        for round_ in range(args.rounds):
            for name in list(engines) if round_ % 2 == 0 else list(engines)[::-1]:
                runs[name].append(run(engines[name], prompts))
        figures = {}
        for name, rows in runs.items():
            steps = [row[1] for row in rows]
            figures[name] = {
                "decode_step_ms": statistics.median(steps),
                "decode_step_ms_spread": [min(steps), max(steps)],
                "run_seconds": statistics.median(row[0] for row in rows),
                "attention_padding_share": rows[0][2],
            }
        figures["groups"]["moved_rows_per_run"] = engines["groups"].runner.moved_rows / (args.rounds + 1)
        figures["step_ratio_one_group_over_groups"] = (
            figures["one_group"]["decode_step_ms"] / figures["groups"]["decode_step_ms"]
        )
        results["batches"][str(batch)] = figures
        print(batch, json.dumps(figures), file=sys.stderr, flush=True)
        engines["groups"].runner.moved_rows = 0
    text = json.dumps(results, indent=2)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()

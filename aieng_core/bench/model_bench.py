"""`aieng bench model`: our model and loading path against transformers and torch.load.

- training: the same loop (AdamW, gradient clipping, zero_grad; identical batches and initial
  weights, read by both sides from the same files) driving our LlamaForCausalLM and
  transformers' LlamaForCausalLM (sdpa attention, use_cache=False). Each side runs in a fresh
  process of its own (`python -m aieng_core.bench.model_bench --side ours|transformers DIR`,
  one JSON line out): one side's allocations, thread pools and import side effects cannot
  slow the other. Warmup steps are not timed. Several rounds, the order alternated each
  round; per side the median and the spread of the rounds, and the ratio of the medians;
- loading: our path (SHA-256 check + memory-mapped safetensors) against torch.load of the
  same weights saved as a .pt file (the peer only; no load path of ours uses torch.load).

The model shape and the optimizer settings come from load_config(): $AIENG_CONFIG, else
configs/pipeline.yaml.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from aieng_core.config import load_config, resolve_config_path
from aieng_core.cpu.quota import usable_cores
from aieng_core.hashing import sha256_file
from aieng_core.model.hf_files import CONFIG_FILE, MODEL_FILE, load_model, save_model_dir
from aieng_core.model.llama import LlamaConfig, LlamaForCausalLM
from aieng_core.model.weights import load_into, unique_state_dict
from aieng_core.output import write_results
from aieng_core.store import Artifact

TRAINING_GOAL = 1.2  # ours / transformers, median tokens/s
SIDES = ("ours", "transformers")
BATCHES_FILE = "batches.safetensors"
LOOP_FILE = "loop.json"


# ---- one side, in its own process -----------------------------------------------------------
def _ours(directory: Path) -> tuple[torch.nn.Module, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]:
    config = LlamaConfig.from_hf_dict(json.loads((directory / CONFIG_FILE).read_text(encoding="utf-8")))
    model = LlamaForCausalLM(config)
    load_into(model, load_file(directory / MODEL_FILE))

    def loss_of(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = model(x, y)[1]
        assert loss is not None
        return loss

    return model, loss_of


def _transformers(directory: Path) -> tuple[torch.nn.Module, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory, attn_implementation="sdpa")
    model.config.use_cache = False  # training: no key/value cache to build

    def loss_of(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = model(input_ids=x, use_cache=False).logits
        return torch.nn.functional.cross_entropy(logits.float().view(-1, logits.size(-1)), y.reshape(-1))

    return model, loss_of


def train_side(side: str, directory: Path) -> dict[str, Any]:
    """Run the shared loop on one side's model; tokens/s over the steps after warmup."""
    loop = json.loads((directory / LOOP_FILE).read_text(encoding="utf-8"))
    load_before = os.getloadavg()[0]  # recorded so that a run on a busy machine shows as such
    torch.set_num_threads(loop["threads"])
    model, loss_of = (_ours if side == "ours" else _transformers)(directory)
    model.train()
    parameters = list(model.parameters())  # a tied embedding once
    optimizer = torch.optim.AdamW(
        parameters, lr=loop["learning_rate"], betas=tuple(loop["betas"]), weight_decay=loop["weight_decay"]
    )
    windows = load_file(directory / BATCHES_FILE)["windows"]  # (steps, batch, block + 1)
    losses, start = [], 0.0
    for index, window in enumerate(windows):
        if index == loop["warmup"]:
            start = time.perf_counter()
        loss = loss_of(window[:, :-1], window[:, 1:])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(parameters, loop["grad_clip"])
        optimizer.step()
        losses.append(loss.item())
    seconds = time.perf_counter() - start
    measured = len(windows) - loop["warmup"]
    return {
        "side": side,
        "pid": os.getpid(),
        "threads": torch.get_num_threads(),
        "load_average_1min_before": load_before,
        "steps_measured": measured,
        "seconds": seconds,
        "tokens_per_second": measured * windows[0, :, :-1].numel() / seconds,
        # Same weights, batches and math: the two sides' losses must agree closely.
        "first_loss": losses[0],
        "last_loss": losses[-1],
    }


def _run_side(side: str, directory: Path) -> dict[str, Any]:
    command = [sys.executable, "-m", "aieng_core.bench.model_bench", "--side", side, str(directory)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"benchmark side {side!r} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _spread(runs: list[dict[str, Any]]) -> dict[str, Any]:
    rates = [run["tokens_per_second"] for run in runs]
    return {
        "median_tokens_per_second": statistics.median(rates),
        "min_tokens_per_second": min(rates),
        "max_tokens_per_second": max(rates),
        "tokens_per_second": rates,
    }


# ---- the suite ------------------------------------------------------------------------------
def run_model_bench(
    steps: int = 20, rounds: int = 3, warmup: int = 3, out: str | None = None, config: str | None = None
) -> dict[str, Any]:
    if rounds < 1 or steps < 1 or warmup < 0:
        raise ValueError("rounds and steps must be at least 1, warmup at least 0")
    settings = load_config(config)
    training = settings.training
    model_config = LlamaConfig(vocab_size=settings.tokenizer.vocab_size, **settings.model.model_dump())
    threads = training.threads or usable_cores()
    torch.manual_seed(training.seed)
    ours = LlamaForCausalLM(model_config)
    generator = torch.Generator().manual_seed(training.seed)
    windows = torch.randint(
        0,
        model_config.vocab_size,
        (warmup + steps, training.batch_size, training.block_size + 1),
        generator=generator,
    )
    with tempfile.TemporaryDirectory(prefix="aieng-model-bench-") as work:
        directory = Path(work)
        save_model_dir(ours, directory)  # the initial weights both sides load, in transformers' layout
        save_file({"windows": windows}, directory / BATCHES_FILE)
        loop = {
            "threads": threads,
            "warmup": warmup,
            "learning_rate": training.learning_rate,
            "betas": [training.beta1, training.beta2],
            "weight_decay": training.weight_decay,
            "grad_clip": training.grad_clip,
        }
        (directory / LOOP_FILE).write_text(json.dumps(loop), encoding="utf-8")

        # Alternate who goes first, so that drift in machine load or thermal state over the
        # run does not favour one side.
        round_records: list[dict[str, Any]] = []
        for index in range(rounds):
            order = list(SIDES) if index % 2 == 0 else list(reversed(SIDES))
            round_records.append(
                {"round": index, "order": order, **{side: _run_side(side, directory) for side in order}}
            )
        per_side = {side: _spread([record[side] for record in round_records]) for side in SIDES}
        ratio = per_side["ours"]["median_tokens_per_second"] / per_side["transformers"]["median_tokens_per_second"]
        loading = _loading_bench(ours, model_config, directory)

    results: dict[str, Any] = {
        "suite": "model",
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "config_file": str(resolve_config_path(config)),
        "machine": {
            "cpus": os.cpu_count(),
            "torch_threads": threads,
            "python": platform.python_version(),
            "platform": platform.platform(),
            "torch": torch.__version__,
        },
        "model": {"parameters": ours.num_parameters(), "config": model_config.to_hf_dict()},
        "training": {
            "method": "each side in a fresh process, same weights/batches/loop; order alternated per round",
            "rounds": round_records,
            "warmup_steps": warmup,
            "steps_measured": steps,
            "tokens_per_step": training.batch_size * training.block_size,
            "ours": per_side["ours"],
            "transformers": per_side["transformers"],
            "ratio_of_medians": ratio,
        },
        "loading": loading,
        "goals": {
            "training_tokens_per_second_vs_transformers": {
                "value": round(ratio, 3),
                "goal": f">= {TRAINING_GOAL}",
                "met": ratio >= TRAINING_GOAL,
            }
        },
    }
    write_results(out, results)
    return results


def _loading_bench(ours: LlamaForCausalLM, model_config: LlamaConfig, directory: Path) -> dict[str, Any]:
    """The same weights as safetensors (ours) and as a .pt file (the peer)."""
    manifest = {"files": {name: sha256_file(directory / name) for name in (MODEL_FILE, CONFIG_FILE)}}
    artifact = Artifact("model_checkpoint", "bench", directory, manifest)
    pt_path = directory / "model.pt"
    torch.save(unique_state_dict(ours), pt_path)

    def load_ours() -> None:
        load_model(artifact)

    def load_pt() -> None:
        # The same construction as ours (meta device, assign), so only the file path differs.
        tensors = torch.load(pt_path, weights_only=True, mmap=True)  # noqa: TID251 -- the peer being measured
        with torch.device("meta"):
            model = LlamaForCausalLM(model_config)
        load_into(model, tensors, assign=True)

    def best(work_fn: Callable[[], None]) -> float:
        timings = []
        for _ in range(5):
            start = time.perf_counter()
            work_fn()
            timings.append(time.perf_counter() - start)
        return min(timings)

    ours_load, pt_load = best(load_ours), best(load_pt)
    return {
        "weights_bytes": (directory / MODEL_FILE).stat().st_size,
        "ours_safetensors_verified_seconds": ours_load,
        "torch_load_pt_seconds": pt_load,
        "ratio_torch_load_to_ours": pt_load / ours_load,
    }


def format_model_results(results: dict[str, Any]) -> str:
    training, loading = results["training"], results["loading"]
    ours, theirs = training["ours"], training["transformers"]
    goal = results["goals"]["training_tokens_per_second_vs_transformers"]
    return "\n".join(
        [
            f"model            {results['model']['parameters']:,} parameters",
            f"training         ours {ours['median_tokens_per_second']:,.0f} tok/s "
            f"({ours['min_tokens_per_second']:,.0f}-{ours['max_tokens_per_second']:,.0f}) vs transformers "
            f"{theirs['median_tokens_per_second']:,.0f} tok/s "
            f"({theirs['min_tokens_per_second']:,.0f}-{theirs['max_tokens_per_second']:,.0f}), "
            f"medians of {len(training['rounds'])} rounds",
            f"                 ratio {training['ratio_of_medians']:.2f}, goal {goal['goal']}: "
            f"{'met' if goal['met'] else 'not met'}",
            "loading          ours (sha256 + safetensors) "
            f"{loading['ours_safetensors_verified_seconds'] * 1000:.1f} ms vs torch.load .pt "
            f"{loading['torch_load_pt_seconds'] * 1000:.1f} ms",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    """One side of the training comparison (run by run_model_bench in a fresh process)."""
    parser = argparse.ArgumentParser(prog="python -m aieng_core.bench.model_bench")
    parser.add_argument("--side", choices=SIDES, required=True)
    parser.add_argument("directory", type=Path, help="a directory prepared by run_model_bench")
    args = parser.parse_args(argv)
    print(json.dumps(train_side(args.side, args.directory)))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`aieng bench model`: our model and loading path against transformers and torch.load.

- training: the same loop (AdamW, clipping, identical batches and initial weights) driving
  our LlamaForCausalLM and transformers' LlamaForCausalLM, tokens/s side by side;
- loading: our path (SHA-256 check + memory-mapped safetensors) against torch.load of the
  same weights saved as a .pt file (the peer only; no load path of ours uses torch.load).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from aieng_core.config import load_config
from aieng_core.hashing import sha256_file
from aieng_core.model.hf_files import CONFIG_FILE, MODEL_FILE, load_model, save_model_dir
from aieng_core.model.llama import LlamaConfig, LlamaForCausalLM
from aieng_core.model.weights import unique_state_dict
from aieng_core.store import Artifact

GOALS = {"training_tokens_per_second_vs_transformers": 1.0}


def _hf_model(directory: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(directory, attn_implementation="sdpa")


class _Trainer:
    """One model, its optimizer and the same step as our training loop."""

    def __init__(self, model: torch.nn.Module, loss_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
        self.model, self.loss_of = model.train(), loss_of
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
        self.seconds = 0.0

    def step(self, x: torch.Tensor, y: torch.Tensor, timed: bool) -> None:
        start = time.perf_counter()
        loss = self.loss_of(x, y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        if timed:
            self.seconds += time.perf_counter() - start


def _interleaved(trainers: list[_Trainer], batches, warmup: int) -> list[float]:
    """Steps per second of each trainer, alternating step by step so that any drift in
    machine load hits both equally."""
    for index, (x, y) in enumerate(batches):
        for trainer in trainers:
            trainer.step(x, y, timed=index >= warmup)
    return [(len(batches) - warmup) / trainer.seconds for trainer in trainers]


def run_model_bench(steps: int = 30, out: str | None = None, config: str | None = None) -> dict[str, Any]:
    settings = load_config(config or "configs/pipeline.yaml")
    training = settings.training
    model_config = LlamaConfig(vocab_size=settings.tokenizer.vocab_size, **settings.model.model_dump())
    torch.manual_seed(training.seed)
    ours = LlamaForCausalLM(model_config)
    generator = torch.Generator().manual_seed(training.seed)
    batches = [
        (lambda w: (w[:, :-1], w[:, 1:]))(
            torch.randint(
                0, model_config.vocab_size, (training.batch_size, training.block_size + 1), generator=generator
            )
        )
        for _ in range(steps + 3)
    ]
    tokens_per_step = training.batch_size * training.block_size
    with tempfile.TemporaryDirectory(prefix="aieng-model-bench-") as work:
        directory = Path(work)
        save_model_dir(ours, directory)
        hf = _hf_model(directory)  # the same initial weights, through transformers' own loader
        vocab = model_config.vocab_size
        ours_sps, hf_sps = _interleaved(
            [
                _Trainer(ours, lambda x, y: ours(x, y)[1]),
                _Trainer(
                    hf, lambda x, y: F.cross_entropy(hf(input_ids=x).logits.float().view(-1, vocab), y.reshape(-1))
                ),
            ],
            batches,
            warmup=3,
        )

        # Loading: the same weights as safetensors (ours) and as a .pt file (the peer).
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
            model.load_state_dict(tensors, strict=False, assign=True)
            model.lm_head.weight = model.model.embed_tokens.weight

        def best(work_fn) -> float:
            timings = []
            for _ in range(5):
                start = time.perf_counter()
                work_fn()
                timings.append(time.perf_counter() - start)
            return min(timings)

        ours_load, pt_load = best(load_ours), best(load_pt)
        results = {
            "suite": "model",
            "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "machine": {
                "cpus": os.cpu_count(),
                "torch_threads": torch.get_num_threads(),
                "python": platform.python_version(),
                "platform": platform.platform(),
            },
            "model": {"parameters": ours.num_parameters(), "config": model_config.to_hf_dict()},
            "training": {
                "steps_measured": steps,
                "tokens_per_step": tokens_per_step,
                "ours_tokens_per_second": ours_sps * tokens_per_step,
                "transformers_tokens_per_second": hf_sps * tokens_per_step,
                "ratio": ours_sps / hf_sps,
            },
            "loading": {
                "weights_bytes": (directory / MODEL_FILE).stat().st_size,
                "ours_safetensors_verified_seconds": ours_load,
                "torch_load_pt_seconds": pt_load,
                "ratio_torch_load_to_ours": pt_load / ours_load,
            },
        }
    results["goals"] = {
        "training_tokens_per_second_vs_transformers": {
            "value": round(results["training"]["ratio"], 3),
            "goal": ">= 1.0",
            "met": results["training"]["ratio"] >= 1.0,
        }
    }
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(results, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return results


def format_model_results(results: dict[str, Any]) -> str:
    t, l = results["training"], results["loading"]
    return "\n".join(
        [
            f"model            {results['model']['parameters']:,} parameters",
            f"training         ours {t['ours_tokens_per_second']:,.0f} tok/s vs transformers "
            f"{t['transformers_tokens_per_second']:,.0f} tok/s  (ratio {t['ratio']:.2f}, goal >= 1.0)",
            "loading          ours (sha256 + safetensors) "
            f"{l['ours_safetensors_verified_seconds'] * 1000:.1f} ms vs torch.load .pt {l['torch_load_pt_seconds'] * 1000:.1f} ms",
        ]
    )

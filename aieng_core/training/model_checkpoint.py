"""model_checkpoint: a Llama-architecture LM trained from scratch on the dataset manifest.

The artifact is a Hugging Face model directory (model.safetensors, config.json,
generation_config.json and the tokenizer files) plus training_state.json and the loss
curves as loss_curve.png. Unchanged dataset, model/training config and code version reuse
the artifact; a training killed part-way resumes from $AIENG_HOME/work/model_checkpoint/<id>/.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aieng_core import asset_keys
from aieng_core.config import AiengConfig
from aieng_core.dataset.dataset_manifest import KIND as DATASET_KIND
from aieng_core.hashing import sha256_file, sha256_json
from aieng_core.model.memory import memory_budget
from aieng_core.store import Artifact, ArtifactSpec, ArtifactStore, Produced, RunInfo
from aieng_core.tokenizer.bpe import TOKENIZER_FILES, load_tokenizer, special_token_id
from aieng_core.tokenizer.bpe_tokenizer import KIND as TOKENIZER_KIND

if TYPE_CHECKING:
    from aieng_core.model.llama import LlamaConfig

# torch and matplotlib are imported inside the functions that train and plot: the Dagster
# code location imports this module to define the asset, and a data-only materialization
# should not pay their import time.

KIND = asset_keys.MODEL_CHECKPOINT
CODE_VERSION = "model_checkpoint-v1"
TRAINING_STATE_FILE = "training_state.json"
LOSS_CURVE_FILE = "loss_curve.png"

log = logging.getLogger("aieng.training")


def model_config_for(config: AiengConfig, tokenizer_dir: Path) -> LlamaConfig:
    from aieng_core.model.llama import LlamaConfig

    tokenizer = load_tokenizer(tokenizer_dir)
    eos = special_token_id(tokenizer, config.tokenizer.eos_token)
    return LlamaConfig(
        vocab_size=tokenizer.get_vocab_size(),
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=special_token_id(tokenizer, config.tokenizer.pad_token),
        **config.model.model_dump(),
    )


def work_dir_for(store: ArtifactStore, artifact_id: str) -> Path:
    return store.home / "work" / KIND / artifact_id


def build_model_checkpoint(
    store: ArtifactStore,
    config: AiengConfig,
    run: RunInfo = RunInfo(),
    logger: Any = log,
    on_step: Callable[[int, dict[str, Any]], None] | None = None,
) -> Artifact:
    from aieng_core.model.hf_files import CONFIG_FILE, GENERATION_CONFIG_FILE, MODEL_FILE, save_model_dir
    from aieng_core.training.corpus import split_token_streams, unigram_cross_entropy
    from aieng_core.training.plot import loss_curve_png
    from aieng_core.training.trainer import pick_device, train

    dataset = store.require_current(DATASET_KIND)
    tokenizer = store.check_input(store.get(TOKENIZER_KIND, dataset.manifest["tokenizer_id"]))
    device = pick_device(config.training.device)
    spec = ArtifactSpec(
        kind=KIND,
        code_version=CODE_VERSION,
        config_sha256=config.section_sha256("model", "training"),
        inputs=((DATASET_KIND, dataset.id), (TOKENIZER_KIND, tokenizer.id)),
        # CUDA and CPU kernels round differently: the same recipe on another device is another model.
        recipe={"device": device.type},
    )
    work_dir = work_dir_for(store, spec.artifact_id())

    def produce(staging: Path) -> Produced:
        store.check_input(dataset)
        model_config = model_config_for(config, tokenizer.path)
        train_tokens, validation_tokens = split_token_streams(store, dataset)
        baseline = unigram_cross_entropy(train_tokens, validation_tokens, model_config.vocab_size)
        logger.info(
            f"{KIND}: training {model_config.num_hidden_layers}-layer Llama on {len(train_tokens):,} train tokens "
            f"({len(validation_tokens):,} validation); unigram baseline {baseline:.4f} nats"
        )
        outcome = train(model_config, config.training, train_tokens, validation_tokens, work_dir, logger, on_step)
        save_model_dir(outcome.model, staging)
        for name in TOKENIZER_FILES:
            shutil.copyfile(tokenizer.path / name, staging / name)
        final = outcome.history[-1]
        train_losses = [h["train_loss"] for h in outcome.history if "train_loss" in h]
        parameters = outcome.model.num_parameters()
        metrics = {
            "train_loss": train_losses[-1] if train_losses else None,
            "validation_loss": final["validation_loss"],
            "train_perplexity": math.exp(train_losses[-1]) if train_losses else None,
            "validation_perplexity": math.exp(final["validation_loss"]),
            "unigram_baseline_loss": baseline,
            "unigram_baseline_perplexity": math.exp(baseline),
            "parameters": parameters,
            "steps": outcome.steps,
            "stopped_by": outcome.stopped_by,
            "resumed_from_step": outcome.resumed_from,
            "tokens_seen": outcome.tokens_seen,
            "train_tokens": int(len(train_tokens)),
            "validation_tokens": int(len(validation_tokens)),
            "device": device.type,
            "threads": outcome.threads,
            "wall_seconds": round(outcome.train_seconds, 3),
            "tokens_per_second": outcome.tokens_seen / max(outcome.train_seconds, 1e-9),
            **memory_budget(parameters),
        }
        state = {
            "steps": outcome.steps,
            "stopped_by": outcome.stopped_by,
            "resumed_from_step": outcome.resumed_from,
            "history": outcome.history,
        }
        (staging / TRAINING_STATE_FILE).write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8")
        (staging / LOSS_CURVE_FILE).write_bytes(loss_curve_png(outcome.history, baseline))
        # The model is its weights, its config and its tokenizer; timings and the plot are not.
        content = {
            name: sha256_file(staging / name)
            for name in (MODEL_FILE, CONFIG_FILE, GENERATION_CONFIG_FILE, *TOKENIZER_FILES)
        }
        return Produced(content_sha256=sha256_json(content), metrics=metrics)

    artifact = store.build(spec, produce, run, logger)
    shutil.rmtree(work_dir, ignore_errors=True)  # the artifact is complete; resume state is no longer needed
    return artifact

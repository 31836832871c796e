"""model_checkpoint: a Llama-architecture LM trained from scratch on the dataset manifest.

The artifact is a Hugging Face model directory (model.safetensors, config.json,
generation_config.json and the tokenizer files) plus training_state.json and the loss
curves as loss_curve.png. Unchanged dataset, model/training config and code version reuse
the artifact; a training killed part-way resumes from $AIENG_HOME/work/model_checkpoint/<id>/.

A run stopped by `max_minutes` before `max_steps` publishes its model under another id, whose
recipe records the steps done (same id, same bytes: a partial model never takes the id of the
full one), and leaves its checkpoint in the full recipe's work directory: the next
materialization with the same inputs resumes there and, reaching `max_steps`, publishes
under the full id the bytes an uninterrupted run would have written.
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aieng_core import asset_keys
from aieng_core.config import AiengConfig
from aieng_core.faults import crash_point
from aieng_core.hashing import sha256_file, sha256_json
from aieng_core.model.memory import BYTES_PER_PARAMETER, memory_budget
from aieng_core.store import Artifact, ArtifactSpec, ArtifactStore, Produced, RunInfo
from aieng_core.store.file_lock import exclusive_lock
from aieng_core.tokenizer.bpe import TOKENIZER_FILES, load_tokenizer, special_token_id

DATASET_KIND = asset_keys.DATASET_MANIFEST
TOKENIZER_KIND = asset_keys.BPE_TOKENIZER

if TYPE_CHECKING:
    from aieng_core.model.llama import LlamaConfig
    from aieng_core.training.torchrun import Launcher
    from aieng_core.training.trainer import TrainOutcome

# torch and matplotlib are imported inside the functions that train and plot: the Dagster
# code location imports this module to define the asset, and a data-only materialization
# should not pay their import time.

KIND = asset_keys.MODEL_CHECKPOINT
# v2: trains on dataset_manifest's memory-mapped token files; a max_minutes stop publishes a partial model.
CODE_VERSION = "model_checkpoint-v3"
TRAINING_STATE_FILE = "training_state.json"
LOSS_CURVE_FILE = "loss_curve.png"

# Every numeric metric of the artifact, with what it measures: the one list the Dagster asset's
# metadata and the tests take the names from. (Besides these: stopped_by, partial, device.)
NUMERIC_METRICS: dict[str, str] = {
    "train_loss": "cross-entropy of the last logged train batch (nats/token)",
    "validation_loss": "cross-entropy on the fixed validation windows at the last step (nats/token)",
    "train_perplexity": "exp(train_loss)",
    "validation_perplexity": "exp(validation_loss)",
    "unigram_baseline_loss": "validation cross-entropy of an add-one unigram model fit on train (nats/token)",
    "unigram_baseline_perplexity": "exp(unigram_baseline_loss)",
    "parameters": "parameters stored, tied weights counted once",
    "steps": "optimizer steps done",
    "max_steps": "optimizer steps the recipe asks for; more than steps when the run was stopped by max_minutes",
    "resumed_from_step": "step of the checkpoint the last run resumed from (absent when it started from scratch)",
    "tokens_seen": "train tokens the steps consumed (steps x batch_size x block_size)",
    "train_tokens": "tokens in the train stream",
    "validation_tokens": "tokens in the validation stream",
    "threads": "torch intra-op threads the steps ran with (in each process)",
    "processes": "data-parallel training processes (training.processes)",
    "wall_seconds": "training time, summed over resumed runs (s)",
    "tokens_per_second": "tokens_seen / wall_seconds",
    **{f"weights_bytes_{name}": f"bytes of the weights in {name}" for name in BYTES_PER_PARAMETER},
    **{
        f"gpu_rule_gib_{name}": f"accelerator memory to ask for in {name}: weights x 1.3 + 2 GiB"
        for name in BYTES_PER_PARAMETER
    },
}

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


@dataclass
class _Trained:
    outcome: TrainOutcome
    baseline: float
    train_tokens: int
    validation_tokens: int


class _StoppedEarly(Exception):
    """Raised out of the full recipe's build, so nothing is published under its id."""

    def __init__(self, trained: _Trained) -> None:
        super().__init__(f"stopped by max_minutes at step {trained.outcome.steps}")
        self.trained = trained


def model_spec(config: AiengConfig, dataset: Artifact, tokenizer: Artifact) -> ArtifactSpec:
    """The full recipe: what decides the bytes of a model trained to max_steps."""
    from aieng_core.cpu.quota import usable_cores
    from aieng_core.training.torchrun import threads_per_rank

    # training.threads: 0 means the cores this process has (its CPU quota: cpu/quota.py), shared
    # out between the processes of a data-parallel run.
    threads = threads_per_rank(config.training, usable_cores())
    return ArtifactSpec(
        kind=KIND,
        code_version=CODE_VERSION,
        config_sha256=config.section_sha256("model", "training"),
        config_sections=config.section_values("model", "training"),
        inputs=((DATASET_KIND, dataset.id), (TOKENIZER_KIND, tokenizer.id)),
        # CUDA and CPU kernels round differently, and CPU reductions split their work by thread
        # count: the same recipe on another device or thread count is another model. (The
        # number of processes is in the training section, when it is not 1.)
        recipe={"device": recipe_device(config.training.device), "threads": threads},
    )


def recipe_device(preference: str) -> str:
    """`cpu` or `cuda` as the config says it (where the model trains checks it is there: the
    ranks of a data-parallel run may run elsewhere, in a GPU pod); `auto`, what this machine has."""
    if preference != "auto":
        return preference
    from aieng_core.training.trainer import pick_device

    return pick_device(preference).type


def build_model_checkpoint(
    store: ArtifactStore,
    config: AiengConfig,
    run: RunInfo = RunInfo(),
    logger: Any = log,
    on_step: Callable[[int, dict[str, Any]], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    launcher: Launcher | None = None,
) -> Artifact:
    """Train (or reuse) the model of the current dataset; `clock` (seconds) is what
    `max_minutes` is measured on. With training.processes > 1 the ranks are started by
    `launcher` (aieng_core/training/torchrun.py; a plain child process by default), and
    on_step and clock are theirs, not this process's."""
    from aieng_core.training.corpus import open_token_streams, unigram_cross_entropy
    from aieng_core.training.trainer import train

    dataset = store.require_current(DATASET_KIND)
    tokenizer = store.check_input(store.get(TOKENIZER_KIND, dataset.manifest["tokenizer_id"]))
    spec = model_spec(config, dataset, tokenizer)
    device = spec.recipe["device"]  # the recipe's device is the one training runs on
    # Keyed by the full recipe: every run towards max_steps, stopped early or killed, resumes here.
    work_dir = work_dir_for(store, spec.artifact_id())

    def produce(staging: Path) -> Produced:
        store.check_input(dataset)
        model_config = model_config_for(config, tokenizer.path)
        train_tokens, validation_tokens = open_token_streams(dataset)
        baseline = unigram_cross_entropy(train_tokens, validation_tokens, model_config.vocab_size)
        logger.info(
            f"{KIND}: training {model_config.num_hidden_layers}-layer Llama on {len(train_tokens):,} train tokens "
            f"({len(validation_tokens):,} validation); unigram baseline {baseline:.4f} nats"
        )
        if config.training.processes == 1:
            outcome = train(
                model_config, config.training, train_tokens, validation_tokens, work_dir, logger, on_step, clock
            )
        else:
            outcome = _train_data_parallel(
                model_config, config, train_tokens, validation_tokens, work_dir, spec, launcher
            )
        trained = _Trained(outcome, baseline, len(train_tokens), len(validation_tokens))
        if outcome.stopped_by == "max_minutes":
            raise _StoppedEarly(trained)
        return _write_artifact(staging, trained, tokenizer, config, device)

    # Two runs of one recipe (racing materializations) would train into one work dir: the second
    # waits here for the first, then finds its artifact and reuses it.
    def waiting() -> None:
        logger.info(f"{KIND}: another process is training {spec.artifact_id()}; waiting for it, then reusing")

    with exclusive_lock(store.home / "work" / "locks" / f"{KIND}-{spec.artifact_id()}.lock", on_wait=waiting):
        # A model stopped by max_minutes is not the full recipe's: produce() raises it out of that build
        # (its staging directory is discarded) and it is published under a recipe recording its steps.
        try:
            artifact = store.build(spec, produce, run, logger)
        except _StoppedEarly as stopped:
            trained = stopped.trained
            partial = replace(
                spec, recipe={**spec.recipe, "steps": trained.outcome.steps, "stopped_by": trained.outcome.stopped_by}
            )
            artifact = store.build(
                partial, lambda staging: _write_artifact(staging, trained, tokenizer, config, device), run, logger
            )
            logger.warning(
                f"{KIND}: stopped by max_minutes after {trained.outcome.steps} of {config.training.max_steps} steps; "
                f"published the partial model as {artifact.id}; materialize again to resume from step "
                f"{trained.outcome.steps} (checkpoint in {work_dir})"
            )
            return artifact
        shutil.rmtree(work_dir, ignore_errors=True)  # the artifact is complete; resume state is no longer needed
        return artifact


def _train_data_parallel(
    model_config: LlamaConfig,
    config: AiengConfig,
    train_tokens: Any,
    validation_tokens: Any,
    work_dir: Path,
    spec: ArtifactSpec,
    launcher: Launcher | None,
) -> TrainOutcome:
    """torchrun's N ranks train; the model is rebuilt here from the weights rank 0 wrote."""
    from safetensors.torch import load_file

    from aieng_core.model.llama import LlamaForCausalLM
    from aieng_core.model.weights import load_into
    from aieng_core.training.torchrun import launch, run_torchrun, write_job
    from aieng_core.training.trainer import TrainOutcome

    device, threads = spec.recipe["device"], spec.recipe["threads"]
    job = write_job(
        work_dir, model_config, config.training, train_tokens, validation_tokens, device=device, threads=threads
    )
    fields, weights = launch(job, launcher or run_torchrun)
    model = LlamaForCausalLM(model_config)
    load_into(model, load_file(weights))
    model.eval()
    return TrainOutcome(model=model, **fields)


def _write_artifact(
    staging: Path, trained: _Trained, tokenizer: Artifact, config: AiengConfig, device: str
) -> Produced:
    from aieng_core.model.hf_files import CONFIG_FILE, GENERATION_CONFIG_FILE, MODEL_FILE, save_model_dir
    from aieng_core.training.plot import loss_curve_png

    outcome = trained.outcome
    save_model_dir(outcome.model, staging)
    crash_point("model_checkpoint.weights_saved")
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
        "unigram_baseline_loss": trained.baseline,
        "unigram_baseline_perplexity": math.exp(trained.baseline),
        "parameters": parameters,
        "steps": outcome.steps,
        "max_steps": config.training.max_steps,
        "stopped_by": outcome.stopped_by,
        "partial": outcome.steps < config.training.max_steps,
        "resumed_from_step": outcome.resumed_from,
        "tokens_seen": outcome.tokens_seen,
        "train_tokens": trained.train_tokens,
        "validation_tokens": trained.validation_tokens,
        "device": device,
        "threads": outcome.threads,
        "processes": config.training.processes,
        "wall_seconds": round(outcome.train_seconds, 3),
        "tokens_per_second": outcome.tokens_seen / max(outcome.train_seconds, 1e-9),
        **memory_budget(parameters),
    }
    state = {
        "steps": outcome.steps,
        "max_steps": config.training.max_steps,
        "stopped_by": outcome.stopped_by,
        "resumed_from_step": outcome.resumed_from,
        "history": outcome.history,
    }
    (staging / TRAINING_STATE_FILE).write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8")
    (staging / LOSS_CURVE_FILE).write_bytes(loss_curve_png(outcome.history, trained.baseline))
    # The model is its weights, its config and its tokenizer; timings and the plot are not.
    content = {
        name: sha256_file(staging / name)
        for name in (MODEL_FILE, CONFIG_FILE, GENERATION_CONFIG_FILE, *TOKENIZER_FILES)
    }
    return Produced(content_sha256=sha256_json(content), metrics=metrics)

"""The training loop: AdamW, warmup + cosine, gradient clipping, seeded, resumable.

Batches are random windows of `block_size + 1` tokens from the packed train stream, drawn
from a seeded torch.Generator; only those windows are read from the stream (which may be a
file on disk far larger than memory) and widened to int64. Everything that decides the next
step (weights, optimizer moments, the generator's state, the step) is checkpointed
atomically as safetensors plus JSON, so a run killed part-way, or stopped by `max_minutes`,
resumes where it stopped and ends with the weights an uninterrupted run would have had.
No pickle anywhere.

Data-parallel (`Ranks` with world > 1, torch.distributed already initialized by the caller,
aieng_core/training/ddp_worker.py): every rank draws the same global batch from the same
generator and reads only its own contiguous share of the windows; DistributedDataParallel
averages the gradients, so each step is the one step a single process would take on the whole
batch, up to float summation order. Rank 0 alone evaluates, logs and checkpoints; all ranks
resume from its checkpoint (weights, optimizer and generator are the same on every rank).
"""

from __future__ import annotations

import json
import logging
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from aieng_core.config import TrainingConfig
from aieng_core.faults import crash_point
from aieng_core.model.llama import LlamaConfig, LlamaForCausalLM
from aieng_core.model.weights import load_into, unique_state_dict
from aieng_core.store.atomic import atomic_directory
from aieng_core.training.corpus import TokenStream

CHECKPOINT_PREFIX = "step-"
log = logging.getLogger("aieng.training")


@dataclass(frozen=True)
class Ranks:
    """This process's place in its data-parallel group."""

    rank: int = 0
    world: int = 1

    @property
    def leader(self) -> bool:
        return self.rank == 0


class TimeBudgetTooSmall(RuntimeError):
    """`max_minutes` ran out before this run trained a single step: there is nothing to publish."""


@dataclass
class TrainOutcome:
    model: LlamaForCausalLM
    steps: int
    stopped_by: str  # "max_steps" or "max_minutes"
    history: list[dict[str, Any]] = field(default_factory=list)  # one entry per logged or evaluated step
    tokens_seen: int = 0
    train_seconds: float = 0.0
    resumed_from: int | None = None
    threads: int = 0  # torch intra-op threads the steps ran with


def pick_device(preference: str) -> torch.device:
    if preference == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("training.device is 'cuda' but no CUDA device is available")
    if preference == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(preference)


def learning_rate(step: int, config: TrainingConfig) -> float:
    """Linear warmup to learning_rate, then cosine decay to min_learning_rate at max_steps."""
    if step < config.warmup_steps:
        return config.learning_rate * (step + 1) / config.warmup_steps
    span = max(1, config.max_steps - config.warmup_steps)
    progress = min(1.0, (step - config.warmup_steps) / span)
    return config.min_learning_rate + 0.5 * (1 + math.cos(math.pi * progress)) * (
        config.learning_rate - config.min_learning_rate
    )


def _make_optimizer(model: LlamaForCausalLM, config: TrainingConfig) -> torch.optim.AdamW:
    # Decay matrices only; norms' gains (1-D) are not shrunk toward zero.
    params = list({id(p): p for p in model.parameters()}.values())
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=config.learning_rate,
        betas=(config.beta1, config.beta2),
    )


def _batch(
    stream: TokenStream, starts: torch.Tensor, block: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    # Read the batch's windows only; the stream stays on disk in its narrow dtype.
    index = starts.numpy()[:, None] + np.arange(block + 1)[None, :]
    windows = torch.from_numpy(np.asarray(stream[index], dtype=np.int64))
    return windows[:, :-1].to(device), windows[:, 1:].to(device)


def eval_starts(length: int, config: TrainingConfig) -> torch.Tensor:
    """Fixed, evenly spread validation windows: the same ones at every evaluation."""
    last = length - config.block_size - 1
    if last < 0:
        raise ValueError(f"validation stream has {length} tokens, fewer than block_size + 1 ({config.block_size + 1})")
    count = min(config.eval_batches * config.batch_size, last + 1)
    return torch.linspace(0, last, count).long()


@torch.no_grad()
def evaluate(
    model: LlamaForCausalLM, stream: TokenStream, starts: torch.Tensor, config: TrainingConfig, device: torch.device
) -> float:
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for chunk in starts.split(config.batch_size):
        x, y = _batch(stream, chunk, config.block_size, device)
        _, loss = model(x, y)
        total += loss.item() * len(chunk)
        count += len(chunk)
    model.train(was_training)
    return total / count


# ---- checkpoints --------------------------------------------------------------------------
def save_training_checkpoint(
    work_dir: Path,
    model: LlamaForCausalLM,
    optimizer: torch.optim.AdamW,
    generator: torch.Generator,
    state: dict[str, Any],
) -> Path:
    """Write work_dir/step-NNNNNNNN atomically, then drop older ones: a kill at any moment
    leaves at least one complete checkpoint."""
    optimizer_state = optimizer.state_dict()
    tensors = {
        f"{index}.{name}": value.contiguous()
        for index, slot in optimizer_state["state"].items()
        for name, value in slot.items()
    }
    target = work_dir / f"{CHECKPOINT_PREFIX}{state['step']:08d}"
    with atomic_directory(target) as staging:
        save_file(unique_state_dict(model), staging / "model.safetensors")
        crash_point("training.checkpoint_weights_written")
        save_file(tensors, staging / "optimizer.safetensors")
        save_file({"batch_generator": generator.get_state()}, staging / "rng.safetensors")
        (staging / "state.json").write_text(
            json.dumps({**state, "param_groups": optimizer_state["param_groups"]}, indent=2)
        )
    crash_point("training.checkpointed")
    for older in work_dir.glob(f"{CHECKPOINT_PREFIX}*"):
        if older != target:
            shutil.rmtree(older, ignore_errors=True)
    return target


def latest_checkpoint(work_dir: Path) -> Path | None:
    complete = sorted(p for p in work_dir.glob(f"{CHECKPOINT_PREFIX}*") if (p / "state.json").is_file())
    return complete[-1] if complete else None


def load_training_checkpoint(
    work_dir: Path,
    model: LlamaForCausalLM,
    optimizer: torch.optim.AdamW,
    generator: torch.Generator,
    device: torch.device,
) -> dict[str, Any] | None:
    checkpoint = latest_checkpoint(work_dir)
    if checkpoint is None:
        return None
    state = json.loads((checkpoint / "state.json").read_text())
    load_into(model, load_file(checkpoint / "model.safetensors", device=str(device)))
    slots: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in load_file(checkpoint / "optimizer.safetensors", device=str(device)).items():
        index, name = key.split(".", 1)
        if name == "step":
            value = value.cpu()  # AdamW keeps its step counter on the CPU
        slots.setdefault(int(index), {})[name] = value
    optimizer.load_state_dict({"state": slots, "param_groups": state.pop("param_groups")})
    generator.set_state(load_file(checkpoint / "rng.safetensors")["batch_generator"])
    return state


# ---- the data-parallel group ------------------------------------------------------------------
def _any_rank(flag: bool, ranks: Ranks, device: torch.device) -> bool:
    """True on every rank when it is true on any: a decision all ranks take at the same step
    (one that stopped alone would leave the others waiting in their next gradient reduction)."""
    if ranks.world == 1:
        return flag
    value = torch.tensor([1.0 if flag else 0.0], device=device)  # NCCL reduces CUDA tensors only
    torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
    return bool(value.item())


def _same_step_on_every_rank(step: int, ranks: Ranks, device: torch.device, work_dir: Path) -> None:
    """Every rank resumed from the same checkpoint: one that read another (a checkpoint written
    while the ranks loaded) would draw other batches from another generator state."""
    if ranks.world == 1:
        return
    steps = torch.tensor([step, -step], dtype=torch.int64, device=device)
    torch.distributed.all_reduce(steps, op=torch.distributed.ReduceOp.MAX)
    highest, lowest = int(steps[0]), -int(steps[1])
    if highest != lowest:
        raise RuntimeError(
            f"the ranks resumed from different checkpoints (steps {lowest} to {highest}) in {work_dir}: is another "
            f"training of this recipe still running?"
        )


def _mean_over_ranks(loss: torch.Tensor, ranks: Ranks) -> float:
    """The loss of the whole batch: the mean of the ranks' equal shares' losses."""
    if ranks.world == 1:
        return loss.item()
    total = loss.detach().reshape(1).clone()
    torch.distributed.all_reduce(total)
    return total.item() / ranks.world


# ---- the loop -------------------------------------------------------------------------------
def train(
    model_config: LlamaConfig,
    config: TrainingConfig,
    train_tokens: TokenStream,
    validation_tokens: TokenStream,
    work_dir: Path,
    logger: Any = log,
    on_step: Callable[[int, dict[str, Any]], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    ranks: Ranks = Ranks(),
) -> TrainOutcome:
    """Train from scratch, or resume from work_dir's checkpoint of the same recipe.

    `max_minutes` bounds this call's training time (read from `clock`, seconds), so that each
    run stopped by it makes progress: it checkpoints where it stopped, and the next call with
    the same work_dir continues from there.
    """
    from aieng_core.cpu.quota import usable_cores

    threads_before = torch.get_num_threads()
    torch.set_num_threads(config.threads or usable_cores())  # 0: the cores this process has
    try:
        return _train(model_config, config, train_tokens, validation_tokens, work_dir, logger, on_step, clock, ranks)
    finally:
        torch.set_num_threads(threads_before)  # don't leak the setting into the rest of the process


def _train(
    model_config: LlamaConfig,
    config: TrainingConfig,
    train_tokens: TokenStream,
    validation_tokens: TokenStream,
    work_dir: Path,
    logger: Any,
    on_step: Callable[[int, dict[str, Any]], None] | None,
    clock: Callable[[], float],
    ranks: Ranks,
) -> TrainOutcome:
    if len(train_tokens) < config.block_size + 2:
        raise ValueError(f"train stream has {len(train_tokens)} tokens, too few for block_size {config.block_size}")
    device = pick_device(config.device)
    if device.type == "cuda":  # this rank's own GPU (torch.cuda.set_device), not always cuda:0
        device = torch.device("cuda", torch.cuda.current_device())
    torch.manual_seed(config.seed)
    model = LlamaForCausalLM(model_config).to(device)
    if config.batch_size % ranks.world:
        raise ValueError(f"batch_size {config.batch_size} is not a multiple of {ranks.world} processes")
    share = config.batch_size // ranks.world  # sequences of each step's batch this rank trains on
    optimizer = _make_optimizer(model, config)
    generator = torch.Generator().manual_seed(config.seed)
    val_starts = eval_starts(len(validation_tokens), config)

    work_dir.mkdir(parents=True, exist_ok=True)
    state = load_training_checkpoint(work_dir, model, optimizer, generator, device)
    resumed_from = state["step"] if state else None
    step = state["step"] if state else 0
    history: list[dict[str, Any]] = state["history"] if state else []
    tokens_seen = state["tokens_seen"] if state else 0
    elapsed_before = state["train_seconds"] if state else 0.0
    if resumed_from is not None and ranks.leader:
        logger.info(f"resuming training from step {resumed_from} (checkpoint in {work_dir})")
    _same_step_on_every_rank(step, ranks, device, work_dir)
    # Built after the checkpoint is loaded: DDP starts by copying rank 0's weights to every rank.
    net = model if ranks.world == 1 else torch.nn.parallel.DistributedDataParallel(model)

    def checkpoint() -> None:
        if not ranks.leader:
            return
        train_seconds = elapsed_before + clock() - started
        saved = {"step": step, "history": history, "tokens_seen": tokens_seen, "train_seconds": train_seconds}
        save_training_checkpoint(work_dir, model, optimizer, generator, saved)

    tokens_per_step = config.batch_size * config.block_size
    started = clock()
    window_start, window_tokens = started, 0
    stopped_by = "max_steps"
    model.train()
    while step < config.max_steps:
        if _any_rank(clock() - started >= config.max_minutes * 60, ranks, device):  # all ranks stop at one step
            stopped_by = "max_minutes"
            break
        lr = learning_rate(step, config)
        for group in optimizer.param_groups:
            group["lr"] = lr
        starts = torch.randint(0, len(train_tokens) - config.block_size - 1, (config.batch_size,), generator=generator)
        mine = starts[ranks.rank * share : (ranks.rank + 1) * share]
        x, y = _batch(train_tokens, mine, config.block_size, device)
        _, loss = net(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
        optimizer.step()
        step += 1
        tokens_seen += tokens_per_step
        window_tokens += tokens_per_step

        record: dict[str, Any] = {}
        logged = step % config.log_every == 0 or step == config.max_steps
        evaluated = step % config.eval_every == 0 or step == config.max_steps
        train_loss = _mean_over_ranks(loss, ranks) if logged or evaluated else 0.0
        if logged:
            now = clock()
            rate = window_tokens / max(now - window_start, 1e-9)
            eta = (config.max_steps - step) * tokens_per_step / rate
            record = {
                "step": step,
                "train_loss": train_loss,
                "lr": lr,
                "grad_norm": float(grad_norm),
                "tokens_per_second": rate,
            }
            if ranks.leader:
                logger.info(
                    f"step {step}/{config.max_steps}  loss {train_loss:.4f}  lr {lr:.2e}  {rate:,.0f} tok/s  ETA "
                    f"{eta:,.0f}s"
                )
            window_start, window_tokens = now, 0
        if evaluated and ranks.leader:
            record = {
                "step": step,
                **record,
                "train_loss": train_loss,
                "validation_loss": evaluate(model, validation_tokens, val_starts, config, device),
            }
            logger.info(f"step {step}: validation loss {record['validation_loss']:.4f}")
        if record:
            history.append(record)
        if step % config.checkpoint_every == 0 and step < config.max_steps:
            checkpoint()
        if on_step is not None and ranks.leader:
            on_step(step, record)

    if stopped_by == "max_minutes":
        if step == (resumed_from or 0):
            raise TimeBudgetTooSmall(
                f"training.max_minutes ({config.max_minutes}) ran out before the first training step of this run "
                f"(at step {step} of {config.max_steps}); nothing was trained or published: raise training.max_minutes"
            )
        # Leave the run resumable where it stopped (before the final evaluation below, which an
        # uninterrupted run does not have in its history), unless the last step already saved it.
        if latest_checkpoint(work_dir) != work_dir / f"{CHECKPOINT_PREFIX}{step:08d}":
            checkpoint()
        if ranks.leader:
            logger.warning(
                f"stopped by max_minutes at step {step} of {config.max_steps}; the next run resumes from here"
            )
    # The outcome ends with the validation loss of the weights it returns, also when stopped between evaluations.
    if not history or history[-1]["step"] != step:
        history.append({"step": step})
    if "validation_loss" not in history[-1] and ranks.leader:
        history[-1]["validation_loss"] = evaluate(model, validation_tokens, val_starts, config, device)
    model.eval()
    return TrainOutcome(
        model=model,
        steps=step,
        stopped_by=stopped_by,
        history=history,
        tokens_seen=tokens_seen,
        train_seconds=elapsed_before + clock() - started,
        resumed_from=resumed_from,
        threads=torch.get_num_threads(),
    )

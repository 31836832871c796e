"""The training loop on small synthetic token streams: schedule, determinism, stopping,
resuming after a kill or a max_minutes stop, streams read from token files, and
checkpoints that are safetensors + JSON only (no pickle)."""

from __future__ import annotations

import io
import itertools
import json
import math
import tokenize
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

import aieng_core
from aieng_core.config import TrainingConfig
from aieng_core.model.llama import LlamaConfig
from aieng_core.model.weights import unique_state_dict
from aieng_core.training import trainer
from aieng_core.training.corpus import TokenFile, unigram_cross_entropy
from aieng_core.training.trainer import TimeBudgetTooSmall, latest_checkpoint, learning_rate, train
from tests.core.fake_clock import StepClock

VOCAB = 40
MODEL = LlamaConfig(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=32,
    eos_token_id=0,
    bos_token_id=0,
    pad_token_id=1,
)
BLOCK, BATCH = 16, 4


def training_config(**overrides) -> TrainingConfig:
    base = dict(
        block_size=BLOCK,
        batch_size=BATCH,
        max_steps=12,
        max_minutes=5,
        learning_rate=3e-3,
        min_learning_rate=3e-4,
        warmup_steps=3,
        weight_decay=0.1,
        grad_clip=1.0,
        eval_every=6,
        eval_batches=2,
        log_every=3,
        checkpoint_every=4,
        seed=7,
        threads=0,
        device="cpu",
    )
    return TrainingConfig(**{**base, **overrides})


def synthetic_stream(length: int, seed: int) -> np.ndarray:
    """A learnable stream: runs of counting (t -> t+1 mod VOCAB) restarted at random points."""
    rng = np.random.default_rng(seed)
    out, value = [], int(rng.integers(VOCAB))
    for _ in range(length):
        out.append(value)
        value = int(rng.integers(VOCAB)) if rng.random() < 0.05 else (value + 1) % VOCAB
    return np.asarray(out, dtype=np.int64)


TRAIN_TOKENS = synthetic_stream(3000, seed=1)
VALIDATION_TOKENS = synthetic_stream(600, seed=2)


def weights(outcome) -> dict[str, torch.Tensor]:
    return unique_state_dict(outcome.model)


def assert_bitwise_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def without_timings(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in record.items() if k != "tokens_per_second"} for record in history]


class Kill(Exception):
    pass


# ---- learning-rate schedule -----------------------------------------------------------------


def test_learning_rate_warmup_then_cosine_to_the_minimum() -> None:
    config = training_config(learning_rate=1e-3, min_learning_rate=1e-4, warmup_steps=10, max_steps=110)
    assert learning_rate(0, config) == pytest.approx(1e-4, rel=1e-12)  # 1/10 of the peak
    assert learning_rate(4, config) == pytest.approx(5e-4, rel=1e-12)
    assert learning_rate(9, config) == pytest.approx(1e-3, rel=1e-12)  # the last warmup step reaches the peak
    assert learning_rate(10, config) == pytest.approx(1e-3, rel=1e-12)  # the cosine starts at the peak
    assert learning_rate(60, config) == pytest.approx(5.5e-4, rel=1e-12)  # half way: the mean of peak and floor
    assert learning_rate(110, config) == pytest.approx(1e-4, rel=1e-12)  # max_steps: the floor
    assert learning_rate(500, config) == pytest.approx(1e-4, rel=1e-12)  # and it stays there
    warmup = [learning_rate(s, config) for s in range(10)]
    decay = [learning_rate(s, config) for s in range(10, 111)]
    assert warmup == sorted(warmup) and len(set(warmup)) == 10
    assert decay == sorted(decay, reverse=True)


def test_learning_rate_without_warmup_starts_at_the_peak() -> None:
    config = training_config(learning_rate=2e-3, min_learning_rate=0.0, warmup_steps=0, max_steps=100)
    assert learning_rate(0, config) == pytest.approx(2e-3, rel=1e-12)
    assert learning_rate(50, config) == pytest.approx(1e-3, rel=1e-12)
    assert learning_rate(100, config) == pytest.approx(0.0, abs=1e-18)


def test_history_records_the_scheduled_learning_rate(tmp_path: Path) -> None:
    config = training_config(log_every=1)
    outcome = train(MODEL, config, TRAIN_TOKENS, VALIDATION_TOKENS, tmp_path / "work")
    lrs = {record["step"]: record["lr"] for record in outcome.history if "lr" in record}
    # The record of step s (after s updates) holds the rate used for update number s - 1.
    assert lrs == {s: learning_rate(s - 1, config) for s in range(1, config.max_steps + 1)}


# ---- a run ------------------------------------------------------------------------------------


def test_run_to_max_steps_learns_and_accounts_tokens(tmp_path: Path) -> None:
    config = training_config(max_steps=60, eval_every=30, log_every=10, checkpoint_every=100)
    seen: list[tuple[int, dict]] = []
    outcome = train(
        MODEL, config, TRAIN_TOKENS, VALIDATION_TOKENS, tmp_path / "work", on_step=lambda s, r: seen.append((s, r))
    )
    assert outcome.stopped_by == "max_steps"
    assert outcome.steps == 60
    assert outcome.resumed_from is None
    assert outcome.tokens_seen == 60 * BATCH * BLOCK
    assert [s for s, _ in seen] == list(range(1, 61))
    assert [r["step"] for _, r in seen if r] == [10, 20, 30, 40, 50, 60]
    assert [h["step"] for h in outcome.history] == [10, 20, 30, 40, 50, 60]
    assert [h["step"] for h in outcome.history if "validation_loss" in h] == [30, 60]
    assert all(math.isfinite(h["train_loss"]) for h in outcome.history)
    # It learned: validation loss far below both the uniform and the unigram baseline.
    baseline = unigram_cross_entropy(TRAIN_TOKENS, VALIDATION_TOKENS, VOCAB)
    final = outcome.history[-1]["validation_loss"]
    assert baseline == pytest.approx(math.log(VOCAB), abs=0.01)  # the stream's tokens are near-uniform
    assert final < outcome.history[2]["validation_loss"] < baseline
    assert final < baseline - 1.0  # far below: it learned the counting, not just frequencies
    assert not outcome.model.training  # returned ready for inference


def test_seeded_runs_are_bitwise_identical(tmp_path: Path) -> None:
    config = training_config()
    first = train(MODEL, config, TRAIN_TOKENS, VALIDATION_TOKENS, tmp_path / "a")
    second = train(MODEL, config, TRAIN_TOKENS, VALIDATION_TOKENS, tmp_path / "b")
    assert_bitwise_equal(weights(first), weights(second))
    assert without_timings(first.history) == without_timings(second.history)
    other_seed = train(MODEL, training_config(seed=8), TRAIN_TOKENS, VALIDATION_TOKENS, tmp_path / "c")
    assert not torch.equal(weights(first)["model.norm.weight"], weights(other_seed)["model.norm.weight"])


@pytest.fixture
def restore_threads() -> Iterator[None]:
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_seeded_runs_with_one_thread_are_bitwise_identical(tmp_path: Path, restore_threads: None) -> None:
    config = training_config(threads=1)
    before = torch.get_num_threads()
    first = train(MODEL, config, TRAIN_TOKENS, VALIDATION_TOKENS, tmp_path / "a")
    assert first.threads == 1  # the configured thread count is what ran
    assert torch.get_num_threads() == before  # and the process's setting is restored afterwards
    second = train(MODEL, config, TRAIN_TOKENS, VALIDATION_TOKENS, tmp_path / "b")
    assert_bitwise_equal(weights(first), weights(second))


def test_max_minutes_stops_the_run_on_the_training_clock(tmp_path: Path) -> None:
    """Each step takes 10 s of a fake clock: 0.5 minutes allow exactly 3 steps."""
    clock = StepClock(seconds_per_step=10.0)
    config = training_config(max_minutes=0.5, max_steps=1000, eval_every=2, log_every=100)
    outcome = train(
        MODEL, config, TRAIN_TOKENS, VALIDATION_TOKENS, tmp_path / "work", on_step=clock.on_step, clock=clock
    )
    assert outcome.stopped_by == "max_minutes"
    assert outcome.steps == 3
    assert outcome.train_seconds == 30.0
    assert outcome.tokens_seen == 3 * BATCH * BLOCK
    # The outcome ends with the validation loss of the weights it returns (step 3), not step 2's.
    assert [h["step"] for h in outcome.history] == [2, 3]
    validation = trainer.evaluate(
        outcome.model,
        VALIDATION_TOKENS,
        trainer.eval_starts(len(VALIDATION_TOKENS), config),
        config,
        torch.device("cpu"),
    )
    assert outcome.history[-1] == {"step": 3, "validation_loss": validation}


@pytest.mark.parametrize("stop_after", [6, 8])  # 8 is also a checkpoint_every step, 6 is not
def test_a_run_stopped_by_max_minutes_resumes_to_max_steps_bitwise(tmp_path: Path, stop_after: int) -> None:
    config = training_config(max_minutes=1)  # checkpoint_every 4, max_steps 12
    reference = train(MODEL, config, TRAIN_TOKENS, VALIDATION_TOKENS, tmp_path / "uninterrupted")

    work = tmp_path / "work"
    clock = StepClock(seconds_per_step=60 / stop_after)
    stopped = train(MODEL, config, TRAIN_TOKENS, VALIDATION_TOKENS, work, on_step=clock.on_step, clock=clock)
    assert (stopped.stopped_by, stopped.steps) == ("max_minutes", stop_after)
    # It left a checkpoint where it stopped, and only that one.
    assert [p.name for p in work.iterdir()] == [f"step-{stop_after:08d}"]
    saved = json.loads((work / f"step-{stop_after:08d}" / "state.json").read_text())
    # Saved at the stop (60 s), or, on a checkpoint_every step, right after that step, before its on_step.
    seconds = 60.0 if stop_after % config.checkpoint_every else 60.0 - clock.seconds_per_step
    assert (saved["step"], saved["tokens_seen"], saved["train_seconds"]) == (
        stop_after,
        stop_after * BATCH * BLOCK,
        seconds,
    )

    # The next run resumes although the checkpoint's 60 s already fill max_minutes: the limit is per run.
    steps_after_resume: list[int] = []
    resumed = train(
        MODEL, config, TRAIN_TOKENS, VALIDATION_TOKENS, work, on_step=lambda s, r: steps_after_resume.append(s)
    )
    assert resumed.resumed_from == stop_after
    assert steps_after_resume == list(range(stop_after + 1, 13))
    assert (resumed.stopped_by, resumed.steps) == ("max_steps", 12)
    assert_bitwise_equal(weights(resumed), weights(reference))
    # The stopped run's final evaluation is not in the history it passed on.
    assert without_timings(resumed.history) == without_timings(reference.history)


def minutes_pass_at_every_reading() -> Callable[[], float]:
    """A clock on which 100 s pass between any two readings: max_minutes 1 runs out at once."""
    readings = itertools.count(step=100.0)
    return lambda: next(readings)


def test_max_minutes_over_before_the_first_step_is_an_error(tmp_path: Path) -> None:
    work = tmp_path / "work"
    config = training_config(max_minutes=1)
    with pytest.raises(TimeBudgetTooSmall, match=r"max_minutes \(1.0\) ran out before the first training step"):
        train(MODEL, config, TRAIN_TOKENS, VALIDATION_TOKENS, work, clock=minutes_pass_at_every_reading())
    assert list(work.iterdir()) == []

    # A resumed run that gets no step done is refused too, its checkpoint left as it was.
    def die(step: int, record: dict) -> None:
        if step == 5:
            raise Kill

    with pytest.raises(Kill):
        train(MODEL, training_config(), TRAIN_TOKENS, VALIDATION_TOKENS, work, on_step=die)
    before = sorted(p.relative_to(work) for p in work.rglob("*"))
    with pytest.raises(TimeBudgetTooSmall, match="at step 4 of 12"):
        train(MODEL, config, TRAIN_TOKENS, VALIDATION_TOKENS, work, clock=minutes_pass_at_every_reading())
    assert sorted(p.relative_to(work) for p in work.rglob("*")) == before
    assert latest_checkpoint(work) == work / "step-00000004"


def test_too_short_streams_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="train stream has 10 tokens"):
        train(MODEL, training_config(), TRAIN_TOKENS[:10], VALIDATION_TOKENS, tmp_path / "a")
    with pytest.raises(ValueError, match="validation stream has 5 tokens"):
        train(MODEL, training_config(), TRAIN_TOKENS, VALIDATION_TOKENS[:5], tmp_path / "b")


# ---- streams read from token files ----------------------------------------------------------


def token_file(path: Path, tokens: np.ndarray, dtype: str = "<u2") -> TokenFile:
    tokens.astype(dtype).tofile(path)
    return TokenFile(path, np.dtype(dtype), len(tokens))


def test_training_on_token_files_equals_training_on_arrays(tmp_path: Path) -> None:
    config = training_config()
    in_memory = train(MODEL, config, TRAIN_TOKENS, VALIDATION_TOKENS, tmp_path / "a")
    train_file = token_file(tmp_path / "train.bin", TRAIN_TOKENS)
    validation_file = token_file(tmp_path / "validation.bin", VALIDATION_TOKENS, "<u4")
    from_files = train(MODEL, config, train_file, validation_file, tmp_path / "b")
    assert_bitwise_equal(weights(from_files), weights(in_memory))
    assert without_timings(from_files.history) == without_timings(in_memory.history)


def test_token_file_reads_like_an_array(tmp_path: Path) -> None:
    stream = token_file(tmp_path / "train.bin", TRAIN_TOKENS)
    assert (tmp_path / "train.bin").stat().st_size == 2 * len(TRAIN_TOKENS)
    assert len(stream) == 3000
    index = np.array([[0, 1, 2], [2997, 2998, 2999]])
    assert np.array_equal(stream[index], TRAIN_TOKENS[index])
    assert np.array_equal(stream[10:20], TRAIN_TOKENS[10:20])
    assert type(stream[10:20]) is np.ndarray  # a copy in memory, not a view of the map
    empty = token_file(tmp_path / "empty.bin", np.empty(0, dtype=np.int64))
    assert len(empty) == 0 and empty[0:5].size == 0


def test_unigram_baseline_read_in_chunks_equals_the_whole_computation(tmp_path: Path) -> None:
    counts = np.bincount(TRAIN_TOKENS, minlength=VOCAB) + 1.0
    expected = float(-np.log(counts / counts.sum())[VALIDATION_TOKENS].mean())
    train_file = token_file(tmp_path / "train.bin", TRAIN_TOKENS)
    validation_file = token_file(tmp_path / "validation.bin", VALIDATION_TOKENS)
    for chunk_tokens in (7, 1000, 1 << 18):  # chunks that split the streams anywhere, and one chunk
        baseline = unigram_cross_entropy(train_file, validation_file, VOCAB, chunk_tokens=chunk_tokens)
        assert baseline == pytest.approx(expected, rel=1e-12), chunk_tokens
    assert math.isnan(unigram_cross_entropy(train_file, VALIDATION_TOKENS[:0], VOCAB))


# ---- kill and resume ------------------------------------------------------------------------


@pytest.mark.parametrize("kill_after", [8, 10])
def test_killed_run_resumes_from_its_last_checkpoint_bitwise(tmp_path: Path, kill_after: int) -> None:
    config = training_config()  # checkpoints after steps 4 and 8; max_steps 12
    reference = train(MODEL, config, TRAIN_TOKENS, VALIDATION_TOKENS, tmp_path / "uninterrupted")

    def die(step: int, record: dict) -> None:
        if step == kill_after:
            raise Kill(f"killed after step {step}")

    work = tmp_path / "work"
    with pytest.raises(Kill):
        train(MODEL, config, TRAIN_TOKENS, VALIDATION_TOKENS, work, on_step=die)
    # Only the newest complete checkpoint is kept.
    assert [p.name for p in work.iterdir()] == ["step-00000008"]
    assert latest_checkpoint(work) == work / "step-00000008"

    steps_after_resume: list[int] = []
    resumed = train(
        MODEL, config, TRAIN_TOKENS, VALIDATION_TOKENS, work, on_step=lambda s, r: steps_after_resume.append(s)
    )
    assert resumed.resumed_from == 8
    assert steps_after_resume == [9, 10, 11, 12]
    assert resumed.steps == 12 and resumed.stopped_by == "max_steps"
    assert resumed.tokens_seen == reference.tokens_seen == 12 * BATCH * BLOCK
    assert_bitwise_equal(weights(resumed), weights(reference))
    assert without_timings(resumed.history) == without_timings(reference.history)


def test_resuming_a_finished_recipe_from_an_old_checkpoint_changes_nothing(tmp_path: Path) -> None:
    """Two kills in a row (after 5, then after 9) still end where an uninterrupted run ends."""
    config = training_config()
    reference = train(MODEL, config, TRAIN_TOKENS, VALIDATION_TOKENS, tmp_path / "uninterrupted")
    work = tmp_path / "work"
    for kill_after in (5, 9):

        def die(step: int, record: dict, kill_after: int = kill_after) -> None:
            if step == kill_after:
                raise Kill

        with pytest.raises(Kill):
            train(MODEL, config, TRAIN_TOKENS, VALIDATION_TOKENS, work, on_step=die)
    final = train(MODEL, config, TRAIN_TOKENS, VALIDATION_TOKENS, work)
    assert final.resumed_from == 8
    assert_bitwise_equal(weights(final), weights(reference))


def test_checkpoints_are_safetensors_and_json_only(tmp_path: Path) -> None:
    config = training_config()
    work = tmp_path / "work"

    def die(step: int, record: dict) -> None:
        if step == 4:
            raise Kill

    with pytest.raises(Kill):
        train(MODEL, config, TRAIN_TOKENS, VALIDATION_TOKENS, work, on_step=die)
    checkpoints = sorted(work.glob("step-*"))
    assert [p.name for p in checkpoints] == ["step-00000004"]
    files = sorted(p.relative_to(checkpoints[0]).as_posix() for p in checkpoints[0].rglob("*"))
    assert files == ["model.safetensors", "optimizer.safetensors", "rng.safetensors", "state.json"]
    assert {Path(f).suffix for f in files} <= {".safetensors", ".json"}
    # Every binary file is real safetensors (loads with the safe loader), nothing else.
    model = load_file(checkpoints[0] / "model.safetensors")
    assert set(model) == set(unique_state_dict(trainer.LlamaForCausalLM(MODEL)))
    assert load_file(checkpoints[0] / "optimizer.safetensors")
    assert set(load_file(checkpoints[0] / "rng.safetensors")) == {"batch_generator"}


def _code_tokens(path: Path) -> list[str]:
    """The source's NAME and OP tokens: comments and strings (docstrings) do not count."""
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline)
    return [t.string for t in tokens if t.type in (tokenize.NAME, tokenize.OP)]


def test_no_pickle_or_torch_load_in_the_library() -> None:
    root = Path(aieng_core.__file__).parent
    offenders = []
    sources = [p for p in sorted(root.rglob("*.py")) if "bench" not in p.relative_to(root).parts[:1]]
    assert any(p.name == "trainer.py" for p in sources) and any(p.name == "hf_files.py" for p in sources)
    for path in sources:
        text = path.read_text(encoding="utf-8")
        if "torch.load(" in text:
            offenders.append(f"{path}: torch.load(")
        names = _code_tokens(path)
        for index, name in enumerate(names):
            if "pickle" in name.lower() or name in ("dill", "joblib", "shelve", "marshal"):
                offenders.append(f"{path}: {name}")
            if name == "torch" and names[index + 1 : index + 3] in ([".", "load"], [".", "save"]):
                offenders.append(f"{path}: torch.{names[index + 2]}")
    assert offenders == []


def test_the_pickle_scan_finds_what_it_looks_for(tmp_path: Path) -> None:
    """The scan above is not vacuous: it flags pickle and torch.load in code, not in prose."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        '"""No pickle here."""\n# pickle in a comment\nimport pickle\nx = torch.load(p)\n', encoding="utf-8"
    )
    names = _code_tokens(sample)
    assert names.count("pickle") == 1
    assert ["torch", ".", "load"] == names[names.index("torch") : names.index("torch") + 3]

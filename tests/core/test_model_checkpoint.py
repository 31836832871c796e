"""model_checkpoint on the demo data with the tiny config: the artifact, its metrics, its
compatibility with transformers, reuse, resume after a kill, partial models of runs stopped
by max_minutes and their resumption, integrity-checked loading and `aieng model train`.

The tiny model is trained once for the whole module, in a copy of the shared built demo
home; tests that change state work on further copies of that home.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import os
import shutil
import threading
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file, save_file

from aieng_core.cli import main
from aieng_core.config import AiengConfig, load_config
from aieng_core.cpu.quota import usable_cores
from aieng_core.dataset.dataset_manifest import build_dataset_manifest, read_dataset
from aieng_core.hashing import sha256_file
from aieng_core.model.hf_files import (
    CONFIG_FILE,
    MODEL_FILE,
    checkpoint_config,
    load_model,
    non_finite_tensors,
    stored_parameters,
)
from aieng_core.model.llama import expected_parameters
from aieng_core.store import Artifact, ArtifactIntegrityError, ArtifactSpec, ArtifactStore, Produced
from aieng_core.store.artifacts import MANIFEST
from aieng_core.tokenizer.bpe import load_tokenizer
from aieng_core.training.corpus import OutdatedDataset, TokenFile, open_token_streams
from aieng_core.training.model_checkpoint import (
    KIND,
    NUMERIC_METRICS,
    build_model_checkpoint,
    model_spec,
    work_dir_for,
)
from aieng_core.training.trainer import TimeBudgetTooSmall
from tests.conftest import DEMO_PARTITIONS, TINY_CONFIG
from tests.core.fake_clock import StepClock
from tests.core.helpers import BuiltHome

ARTIFACT_FILES = [
    "config.json",
    "generation_config.json",
    "loss_curve.png",
    "model.safetensors",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "training_state.json",
]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TINY_PARAMETERS = 123_712  # vocab 512 x 64 (tied) + 2 x 45,440 per layer + 64 (final norm)
SAMPLE_TEXT = "The data pipeline cleans raw text, then the tokenizer splits it into tokens."


@dataclass
class Trained:
    home: Path
    store: ArtifactStore
    config: AiengConfig
    artifact: Artifact
    steps_reported: list[int]


@pytest.fixture(scope="module")
def trained(built_demo: BuiltHome, tmp_path_factory: pytest.TempPathFactory) -> Trained:
    home = tmp_path_factory.mktemp("model-checkpoint") / "home"
    shutil.copytree(built_demo.home, home)
    store = ArtifactStore(home)
    config = load_config(TINY_CONFIG)
    steps: list[int] = []
    artifact = build_model_checkpoint(store, config, on_step=lambda step, record: steps.append(step))
    return Trained(home, store, config, artifact, steps)


@pytest.fixture(scope="module")
def short_run(trained: Trained, tmp_path_factory: pytest.TempPathFactory) -> Artifact:
    """The 10-step recipe of short_config, trained without interruption in a copy of the home."""
    store = copy_of(trained, tmp_path_factory.mktemp("short-run") / "home")
    return build_model_checkpoint(store, short_config(trained.config))


def copy_of(trained: Trained, target: Path) -> ArtifactStore:
    shutil.copytree(trained.home, target)
    return ArtifactStore(target)


def short_config(config: AiengConfig, **training) -> AiengConfig:
    """The tiny config with a 10-step training (checkpoint after step 5)."""
    changes = {"max_steps": 10, "checkpoint_every": 5, "eval_every": 5, "log_every": 5, **training}
    return config.model_copy(update={"training": config.training.model_copy(update=changes)})


def sample_ids(artifact: Artifact) -> torch.Tensor:
    return torch.tensor([load_tokenizer(artifact.path).encode(SAMPLE_TEXT).ids])


# ---- the artifact ---------------------------------------------------------------------------


def test_artifact_holds_a_hugging_face_model_directory(trained: Trained) -> None:
    artifact = trained.artifact
    assert artifact.reused is False
    assert sorted(artifact.manifest["files"]) == ARTIFACT_FILES
    assert sorted(p.name for p in artifact.path.iterdir()) == sorted([*ARTIFACT_FILES, MANIFEST])
    assert artifact.file("loss_curve.png").read_bytes().startswith(PNG_MAGIC)
    assert trained.store.verify(artifact) == []
    assert trained.store.require_current(KIND).id == artifact.id
    inputs = {item["kind"]: item["id"] for item in artifact.manifest["inputs"]}
    dataset = trained.store.require_current("dataset_manifest")
    assert inputs == {"dataset_manifest": dataset.id, "bpe_tokenizer": dataset.manifest["tokenizer_id"]}
    # The tokenizer files are the tokenizer artifact's, byte for byte.
    tokenizer = trained.store.get("bpe_tokenizer", inputs["bpe_tokenizer"])
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        assert artifact.file(name).read_bytes() == tokenizer.file(name).read_bytes()


def test_training_ran_every_step_once(trained: Trained) -> None:
    assert trained.steps_reported == list(range(1, 151))
    metrics = trained.artifact.metrics
    assert metrics["steps"] == metrics["max_steps"] == 150 and metrics["stopped_by"] == "max_steps"
    assert metrics["partial"] is False
    assert metrics["resumed_from_step"] is None
    state = json.loads(trained.artifact.file("training_state.json").read_text())
    assert state["steps"] == 150 and state["stopped_by"] == "max_steps"
    assert [h["step"] for h in state["history"]] == [25, 50, 75, 100, 125, 150]
    assert [h["step"] for h in state["history"] if "validation_loss" in h] == [50, 100, 150]
    assert state["history"][-1]["validation_loss"] == metrics["validation_loss"]
    assert state["history"][-1]["train_loss"] == metrics["train_loss"]
    # The work directory of the finished run is gone.
    assert not work_dir_for(trained.store, trained.artifact.id).exists()


def test_metrics_are_consistent(trained: Trained) -> None:
    m = trained.artifact.metrics
    expected_keys = {
        "train_loss", "validation_loss", "train_perplexity", "validation_perplexity",
        "unigram_baseline_loss", "tokens_seen", "tokens_per_second", "wall_seconds", "parameters",
        "weights_bytes_fp32", "weights_bytes_bf16", "weights_bytes_int8",
        "gpu_rule_gib_fp32", "gpu_rule_gib_bf16", "gpu_rule_gib_int8",
    }  # fmt: skip
    assert expected_keys <= set(m), sorted(expected_keys - set(m))
    assert m["validation_perplexity"] == math.exp(m["validation_loss"])
    assert m["train_perplexity"] == math.exp(m["train_loss"])
    assert m["unigram_baseline_perplexity"] == math.exp(m["unigram_baseline_loss"])
    tiny = trained.config.training
    assert m["tokens_seen"] == 150 * tiny.batch_size * tiny.block_size == 76_800
    assert m["wall_seconds"] > 0
    assert m["tokens_per_second"] == pytest.approx(m["tokens_seen"] / m["wall_seconds"], rel=1e-2)
    config = checkpoint_config(trained.artifact)
    assert m["parameters"] == expected_parameters(config) == TINY_PARAMETERS
    assert m["weights_bytes_fp32"] == 4 * m["parameters"]
    assert m["weights_bytes_bf16"] == 2 * m["parameters"]
    assert m["weights_bytes_int8"] == m["parameters"]
    assert m["gpu_rule_gib_fp32"] == pytest.approx(m["parameters"] * 4 * 1.3 / 2**30 + 2, abs=5e-5)
    assert m["gpu_rule_gib_bf16"] == pytest.approx(m["parameters"] * 2 * 1.3 / 2**30 + 2, abs=5e-5)


def test_numeric_metrics_are_exactly_the_listed_ones(trained: Trained) -> None:
    """NUMERIC_METRICS, which the Dagster asset shows, names every number the artifact records."""
    m = trained.artifact.metrics
    numbers = {name for name, value in m.items() if isinstance(value, (int, float)) and not isinstance(value, bool)}
    assert numbers == set(NUMERIC_METRICS) - {"resumed_from_step"}  # None: this run started from scratch
    assert set(m) == set(NUMERIC_METRICS) | {"stopped_by", "partial", "device"}


def test_model_beats_the_unigram_baseline(trained: Trained) -> None:
    m = trained.artifact.metrics
    assert m["validation_loss"] < m["unigram_baseline_loss"]
    assert m["validation_perplexity"] < m["unigram_baseline_perplexity"]


def test_config_json_matches_the_tiny_model_config(trained: Trained) -> None:
    config = checkpoint_config(trained.artifact)
    tokenizer = load_tokenizer(trained.artifact.path)
    model = trained.config.model
    assert config.vocab_size == tokenizer.get_vocab_size() == 512
    assert (config.hidden_size, config.intermediate_size, config.num_hidden_layers) == (64, 172, 2)
    assert (config.num_attention_heads, config.num_key_value_heads) == (
        model.num_attention_heads,
        model.num_key_value_heads,
    )
    assert config.tie_word_embeddings is True
    assert config.eos_token_id == tokenizer.token_to_id("<|endoftext|>")
    assert config.pad_token_id == tokenizer.token_to_id("<|pad|>")


def _independent_streams(store: ArtifactStore, dataset: Artifact) -> tuple[list[int], list[int]]:
    """Train and validation tokens straight from the Parquet files, split by the documented
    rule: sha256(seed + NUL + id)[:8] as a fraction of 2**64 < validation_fraction."""
    manifest = read_dataset(dataset)
    fraction, seed = manifest["split"]["validation_fraction"], manifest["split"]["seed"]
    train, validation = [], []
    for partition in DEMO_PARTITIONS:
        tokenized = store.get("tokenized_documents", manifest["artifacts"][partition])
        for row in pq.read_table(tokenized.file("tokens.parquet"), columns=["id", "input_ids"]).to_pylist():
            digest = hashlib.sha256(f"{seed}\0{row['id']}".encode()).digest()
            side = validation if int.from_bytes(digest[:8], "big") / 2**64 < fraction else train
            side.extend(row["input_ids"])
    return train, validation


def test_unigram_baseline_equals_an_independent_computation(trained: Trained) -> None:
    dataset = trained.store.require_current("dataset_manifest")
    train, validation = _independent_streams(trained.store, dataset)
    vocab = checkpoint_config(trained.artifact).vocab_size
    counts = Counter(train)
    total = len(train) + vocab  # add-one smoothing over the whole vocabulary
    expected = -sum(math.log((counts[t] + 1) / total) for t in validation) / len(validation)
    m = trained.artifact.metrics
    assert m["unigram_baseline_loss"] == pytest.approx(expected, rel=1e-9)
    assert m["train_tokens"] == len(train)
    assert m["validation_tokens"] == len(validation)
    summary = read_dataset(dataset)["partitions"]
    assert len(train) == sum(p["train_tokens"] for p in summary)
    assert len(validation) == sum(p["validation_tokens"] for p in summary)
    # Training reads the same streams from the dataset's token files, in the same order.
    ours_train, ours_validation = open_token_streams(dataset)
    assert isinstance(ours_train, TokenFile) and isinstance(ours_validation, TokenFile)
    assert (len(ours_train), len(ours_validation)) == (len(train), len(validation))
    assert np.array_equal(ours_train[:], np.asarray(train)) and np.array_equal(
        ours_validation[:], np.asarray(validation)
    )


# ---- transformers reads the artifact --------------------------------------------------------


def test_transformers_loads_the_artifact_with_equal_logits_and_greedy_tokens(trained: Trained) -> None:
    import transformers

    artifact = trained.artifact
    ours = load_model(artifact)
    hf = transformers.AutoModelForCausalLM.from_pretrained(artifact.path).eval()
    assert type(hf) is transformers.LlamaForCausalLM
    assert hf.num_parameters() == ours.num_parameters() == TINY_PARAMETERS
    ids = sample_ids(artifact)
    assert ids.shape[1] > 8
    with torch.no_grad():
        difference = (hf(ids).logits - ours(ids)[0]).abs().max().item()
    assert difference <= 1e-4
    new = 16
    mine = ours.generate_greedy(ids, new)
    theirs = hf.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False, eos_token_id=None
    )
    assert mine.tolist() == theirs.tolist()


def test_auto_tokenizer_loads_the_artifact(trained: Trained) -> None:
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(trained.artifact.path)
    ours = load_tokenizer(trained.artifact.path)
    assert tokenizer.encode(SAMPLE_TEXT) == ours.encode(SAMPLE_TEXT).ids
    assert tokenizer.decode(tokenizer.encode(SAMPLE_TEXT)) == SAMPLE_TEXT
    assert tokenizer.eos_token == "<|endoftext|>" and tokenizer.pad_token == "<|pad|>"
    config = checkpoint_config(trained.artifact)
    assert tokenizer.eos_token_id == config.eos_token_id and tokenizer.pad_token_id == config.pad_token_id
    assert len(tokenizer) == config.vocab_size


# ---- reuse, new recipes, resume -------------------------------------------------------------


def test_unchanged_inputs_reuse_the_artifact_without_training(trained: Trained, tmp_path: Path) -> None:
    store = copy_of(trained, tmp_path / "home")
    calls: list[int] = []
    again = build_model_checkpoint(store, trained.config, on_step=lambda step, record: calls.append(step))
    assert again.reused is True
    assert calls == []
    assert again.id == trained.artifact.id
    assert again.manifest == trained.artifact.manifest


def test_a_changed_training_config_is_a_new_artifact(trained: Trained, tmp_path: Path) -> None:
    store = copy_of(trained, tmp_path / "home")
    changed = build_model_checkpoint(store, short_config(trained.config))
    assert changed.reused is False
    assert changed.id != trained.artifact.id
    assert changed.metrics["steps"] == 10
    assert changed.metrics["tokens_seen"] == 10 * 16 * 32
    assert store.require_current(KIND).id == changed.id
    assert store.list_ids(KIND) == sorted([trained.artifact.id, changed.id])
    # The old artifact is untouched, and going back to the old config reuses it.
    assert store.verify(store.get(KIND, trained.artifact.id)) == []
    back = build_model_checkpoint(store, trained.config, on_step=lambda step, record: pytest.fail("trained again"))
    assert back.reused is True and back.id == trained.artifact.id


def test_the_recipe_hashes_the_model_and_training_sections(trained: Trained) -> None:
    config = trained.config
    recorded = trained.artifact.manifest["config_sha256"]
    assert recorded == config.section_sha256("model", "training")
    wider = config.model_copy(update={"model": config.model.model_copy(update={"intermediate_size": 176})})
    assert wider.section_sha256("model", "training") != recorded
    assert short_config(config).section_sha256("model", "training") != recorded


class Kill(Exception):
    pass


def test_a_killed_training_resumes_and_matches_an_uninterrupted_one(
    trained: Trained, short_run: Artifact, tmp_path: Path
) -> None:
    config = short_config(trained.config)
    killed = copy_of(trained, tmp_path / "killed")

    def die(step: int, record: dict) -> None:
        if step == 7:
            raise Kill

    with pytest.raises(Kill):
        build_model_checkpoint(killed, config, on_step=die)
    # No artifact appeared, nothing half-written is left beside the old one, the old one is current.
    kind_dir = killed.root / KIND
    assert sorted(p.name for p in kind_dir.iterdir()) == [trained.artifact.id]
    assert killed.require_current(KIND).id == trained.artifact.id
    work_dirs = list((killed.home / "work" / KIND).iterdir())
    assert len(work_dirs) == 1
    assert [p.name for p in work_dirs[0].iterdir()] == ["step-00000005"]

    resumed_steps: list[int] = []
    resumed = build_model_checkpoint(killed, config, on_step=lambda step, record: resumed_steps.append(step))
    assert resumed.reused is False
    assert resumed.metrics["resumed_from_step"] == 5
    assert resumed_steps == list(range(6, 11))
    assert resumed.metrics["steps"] == 10
    assert resumed.metrics["tokens_seen"] == 10 * 16 * 32
    assert work_dirs[0].name == resumed.id
    assert not work_dirs[0].exists()

    uninterrupted = short_run
    assert uninterrupted.id == resumed.id
    assert uninterrupted.metrics["resumed_from_step"] is None
    assert sha256_file(resumed.file(MODEL_FILE)) == sha256_file(uninterrupted.file(MODEL_FILE))
    assert resumed.content_sha256 == uninterrupted.content_sha256
    assert resumed.metrics["validation_loss"] == uninterrupted.metrics["validation_loss"]


# ---- runs stopped by max_minutes ------------------------------------------------------------


def time_cut(store: ArtifactStore, config: AiengConfig) -> Artifact:
    """Train short_config where each step takes 20 s of a fake clock: max_minutes (2) stops it after 6 of 10 steps."""
    assert config.training.max_minutes == 2
    clock = StepClock(seconds_per_step=20.0)
    return build_model_checkpoint(store, config, on_step=clock.on_step, clock=clock)


def partial_id(store: ArtifactStore, config: AiengConfig, steps: int) -> str:
    """The id of the recipe that records a max_minutes stop after `steps` steps."""
    dataset = store.require_current("dataset_manifest")
    spec = model_spec(config, dataset, store.get("bpe_tokenizer", dataset.manifest["tokenizer_id"]))
    assert spec.recipe == {"device": "cpu", "threads": usable_cores()}
    return dataclasses.replace(spec, recipe={**spec.recipe, "steps": steps, "stopped_by": "max_minutes"}).artifact_id()


def test_the_cores_the_process_has_are_part_of_the_id(trained: Trained) -> None:
    """training.threads 0 follows the cores this process has (its affinity mask and cgroup CPU
    limit: cpu/quota.py), not torch's default; CPU reductions split by thread, so the id must too."""
    store, config = trained.store, trained.config
    assert config.training.threads == 0
    dataset = store.require_current("dataset_manifest")
    tokenizer = store.get("bpe_tokenizer", dataset.manifest["tokenizer_id"])
    allowed = os.sched_getaffinity(0)
    assert len(allowed) >= 2, "this test needs a machine with two CPUs"
    threads_before = torch.get_num_threads()
    try:
        os.sched_setaffinity(0, {min(allowed)})  # as `taskset -c 0` would run it
        one = model_spec(config, dataset, tokenizer)
        os.sched_setaffinity(0, set(sorted(allowed)[:2]))
        two = model_spec(config, dataset, tokenizer)
    finally:
        os.sched_setaffinity(0, allowed)
    assert torch.get_num_threads() == threads_before  # torch's default is not what decides
    assert (one.recipe["threads"], two.recipe["threads"]) == (1, 2)
    assert one.artifact_id() != two.artifact_id()
    if usable_cores() == 2:
        assert trained.artifact.id == two.artifact_id()
    pinned = config.model_copy(update={"training": config.training.model_copy(update={"threads": 1})})
    assert model_spec(pinned, dataset, tokenizer).recipe["threads"] == 1  # a fixed count wins


def test_a_max_minutes_stop_publishes_a_partial_model_under_an_id_of_its_own(
    trained: Trained, short_run: Artifact, tmp_path: Path
) -> None:
    config = short_config(trained.config)
    store = copy_of(trained, tmp_path / "home")
    partial = time_cut(store, config)
    assert partial.reused is False
    assert partial.id == partial_id(store, config, steps=6) != short_run.id
    m = partial.metrics
    assert (m["steps"], m["max_steps"], m["stopped_by"], m["partial"]) == (6, 10, "max_minutes", True)
    assert m["tokens_seen"] == 6 * 16 * 32 and m["resumed_from_step"] is None
    state = json.loads(partial.file("training_state.json").read_text())
    assert (state["steps"], state["max_steps"], state["stopped_by"]) == (6, 10, "max_minutes")
    assert state["history"][-1]["step"] == 6 and state["history"][-1]["validation_loss"] == m["validation_loss"]
    assert store.verify(partial) == []
    assert store.require_current(KIND).id == partial.id
    # Nothing was published under the full recipe's id; its work directory holds the checkpoint of the stop.
    assert store.list_ids(KIND) == sorted([trained.artifact.id, partial.id])
    assert sorted(p.name for p in (store.root / KIND).iterdir()) == store.list_ids(KIND)  # no leftovers
    assert [p.name for p in work_dir_for(store, short_run.id).iterdir()] == ["step-00000006"]


def test_a_time_cut_at_the_same_step_has_the_same_id_and_bytes(
    trained: Trained, short_run: Artifact, tmp_path: Path
) -> None:
    config = short_config(trained.config)
    first_store, second_store = copy_of(trained, tmp_path / "first"), copy_of(trained, tmp_path / "second")
    first, second = time_cut(first_store, config), time_cut(second_store, config)
    assert second.id == first.id
    assert second.content_sha256 == first.content_sha256
    assert sha256_file(second.file(MODEL_FILE)) == sha256_file(first.file(MODEL_FILE))
    # Trained again to the same step (its checkpoint lost), the published partial model is reused.
    shutil.rmtree(work_dir_for(first_store, short_run.id))
    again = time_cut(first_store, config)
    assert again.reused is True and again.id == first.id and again.manifest == first.manifest


def test_the_next_run_resumes_a_time_cut_run_to_the_uninterrupted_bytes(
    trained: Trained, short_run: Artifact, tmp_path: Path
) -> None:
    config = short_config(trained.config)
    store = copy_of(trained, tmp_path / "home")
    partial = time_cut(store, config)
    steps: list[int] = []
    full = build_model_checkpoint(store, config, on_step=lambda step, record: steps.append(step))
    assert steps == [7, 8, 9, 10]
    assert full.reused is False and full.id == short_run.id
    m = full.metrics
    assert (m["steps"], m["max_steps"], m["stopped_by"], m["partial"]) == (10, 10, "max_steps", False)
    assert m["resumed_from_step"] == 6 and m["tokens_seen"] == 10 * 16 * 32
    assert full.content_sha256 == short_run.content_sha256
    assert sha256_file(full.file(MODEL_FILE)) == sha256_file(short_run.file(MODEL_FILE))
    assert m["validation_loss"] == short_run.metrics["validation_loss"]
    assert store.require_current(KIND).id == full.id
    assert not work_dir_for(store, full.id).exists()
    # The partial model stays published, unchanged, under its own id.
    assert store.list_ids(KIND) == sorted([trained.artifact.id, partial.id, full.id])
    assert store.verify(store.get(KIND, partial.id)) == []


def test_max_minutes_over_before_the_first_step_publishes_nothing(trained: Trained, tmp_path: Path) -> None:
    store = copy_of(trained, tmp_path / "home")
    readings = itertools.count(step=1000.0)  # more than max_minutes passes between any two readings
    with pytest.raises(
        TimeBudgetTooSmall, match="ran out before the first training step .* raise training.max_minutes"
    ):
        build_model_checkpoint(store, short_config(trained.config), clock=lambda: next(readings))
    assert sorted(p.name for p in (store.root / KIND).iterdir()) == [trained.artifact.id]
    assert store.require_current(KIND).id == trained.artifact.id


def test_a_dataset_manifest_without_token_files_is_a_clear_error(trained: Trained, tmp_path: Path) -> None:
    """A dataset_manifest made before the token files existed (v1) is refused, naming the fix;
    re-materializing dataset_manifest makes training work again."""
    store = copy_of(trained, tmp_path / "home")
    current = store.require_current("dataset_manifest")
    document = {key: value for key, value in read_dataset(current).items() if key != "token_files"}

    def produce(staging: Path) -> Produced:
        (staging / "dataset.json").write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
        return Produced("v1-content", current.metrics, extra={"tokenizer_id": current.manifest["tokenizer_id"]})

    inputs = tuple((item["kind"], item["id"]) for item in current.manifest["inputs"])
    spec = ArtifactSpec("dataset_manifest", "dataset_manifest-v1", current.manifest["config_sha256"], inputs=inputs)
    old = store.build(spec, produce)
    assert store.require_current("dataset_manifest").id == old.id
    with pytest.raises(OutdatedDataset) as error:
        build_model_checkpoint(store, trained.config)
    assert str(error.value) == (
        f"dataset_manifest artifact {old.id} has no token files (train.bin, validation.bin): it was made by "
        "dataset_manifest-v1, an older dataset_manifest; re-materialize it with "
        "`dagster asset materialize -m orchestration.definitions --select dataset_manifest`, then retry"
    )
    assert store.list_ids(KIND) == [trained.artifact.id]
    rebuilt = build_dataset_manifest(store, trained.config)
    assert rebuilt.id == current.id != old.id
    assert build_model_checkpoint(store, trained.config).id == trained.artifact.id


# ---- integrity-checked loading --------------------------------------------------------------


def copied_artifact(artifact: Artifact, target: Path) -> Artifact:
    """The artifact's files at another path, with the original manifest."""
    shutil.copytree(artifact.path, target)
    return replace(artifact, path=target, manifest=json.loads((target / MANIFEST).read_text()))


def test_intact_copy_loads(trained: Trained, tmp_path: Path) -> None:
    copy = copied_artifact(trained.artifact, tmp_path / "copy")
    model = load_model(copy)
    assert not model.training
    reference = load_model(trained.artifact)
    for name, tensor in reference.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name
    assert non_finite_tensors(copy) == []
    assert stored_parameters(copy) == TINY_PARAMETERS


def flip_one_byte(path: Path, offset: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    index = len(data) // 2 if offset is None else offset
    data[index] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_damaged_weights_are_refused_naming_the_file(trained: Trained, tmp_path: Path, damage: str) -> None:
    copy = copied_artifact(trained.artifact, tmp_path / "copy")
    weights = copy.file(MODEL_FILE)
    if damage == "flip":
        flip_one_byte(weights)
    elif damage == "truncate":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    else:
        weights.unlink()
    for load in (load_model, non_finite_tensors, stored_parameters):
        with pytest.raises(ArtifactIntegrityError) as error:
            load(copy)
        assert str(weights) in str(error.value), load.__name__
        assert MODEL_FILE in str(error.value)
        assert ("missing" if damage == "delete" else "SHA-256") in str(error.value)


def test_tampered_config_is_refused_naming_config_json(trained: Trained, tmp_path: Path) -> None:
    copy = copied_artifact(trained.artifact, tmp_path / "copy")
    config = json.loads(copy.file(CONFIG_FILE).read_text())
    config["num_hidden_layers"] = 3
    copy.file(CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    with pytest.raises(ArtifactIntegrityError) as error:
        load_model(copy)
    assert str(copy.file(CONFIG_FILE)) in str(error.value)
    assert MODEL_FILE not in str(error.value)
    with pytest.raises(ArtifactIntegrityError, match="config.json"):
        checkpoint_config(copy)


def test_a_file_missing_from_the_manifest_is_refused(trained: Trained, tmp_path: Path) -> None:
    copy = copied_artifact(trained.artifact, tmp_path / "copy")
    manifest = {**copy.manifest, "files": {k: v for k, v in copy.manifest["files"].items() if k != MODEL_FILE}}
    with pytest.raises(ArtifactIntegrityError, match="model.safetensors: not listed"):
        load_model(replace(copy, manifest=manifest))


def rewritten_artifact(
    base: Artifact, target: Path, tensors: dict[str, torch.Tensor] | None = None, raw_weights: bytes | None = None
) -> Artifact:
    """A copy of `base` with other weights, and a manifest whose hashes match them."""
    shutil.copytree(base.path, target)
    if tensors is not None:
        save_file(tensors, target / MODEL_FILE, metadata={"format": "pt"})
    if raw_weights is not None:
        (target / MODEL_FILE).write_bytes(raw_weights)
    manifest = json.loads((target / MANIFEST).read_text())
    manifest["files"] = {name: sha256_file(target / name) for name in manifest["files"]}
    (target / MANIFEST).write_text(json.dumps(manifest))
    return replace(base, path=target, manifest=manifest)


def test_weights_that_match_the_manifest_but_are_not_safetensors_are_refused(trained: Trained, tmp_path: Path) -> None:
    crafted = rewritten_artifact(
        trained.artifact, tmp_path / "crafted", raw_weights=b"\x08\x00\x00\x00\x00\x00\x00\x00not json"
    )
    with pytest.raises(ArtifactIntegrityError, match="model.safetensors: unreadable safetensors"):
        load_model(crafted)
    # The functions the asset checks call must refuse it the same clear way, naming the file.
    for read in (non_finite_tensors, stored_parameters):
        with pytest.raises(ArtifactIntegrityError, match="model.safetensors: unreadable safetensors"):
            read(crafted)


def test_non_finite_tensors_names_each_bad_tensor(trained: Trained, tmp_path: Path) -> None:
    tensors = load_file(trained.artifact.file(MODEL_FILE))
    tensors["model.layers.1.mlp.up_proj.weight"][3, 5] = float("nan")
    tensors["model.norm.weight"][0] = float("-inf")
    crafted = rewritten_artifact(trained.artifact, tmp_path / "crafted", tensors=tensors)
    assert non_finite_tensors(crafted) == ["model.layers.1.mlp.up_proj.weight", "model.norm.weight"]
    assert stored_parameters(crafted) == TINY_PARAMETERS


def test_stored_parameters_counts_what_is_stored(trained: Trained, tmp_path: Path) -> None:
    tensors = load_file(trained.artifact.file(MODEL_FILE))
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()  # an untied head stored anyway
    crafted = rewritten_artifact(trained.artifact, tmp_path / "crafted", tensors=tensors)
    assert stored_parameters(crafted) == TINY_PARAMETERS + 512 * 64
    assert expected_parameters(checkpoint_config(crafted)) == TINY_PARAMETERS
    with pytest.raises(ValueError, match=r"unexpected \['lm_head.weight'\]"):
        load_model(crafted)


# ---- `aieng model train` --------------------------------------------------------------------


def run_cli(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_model_train_reuses_and_prints_one_json_document(
    trained: Trained, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    store = copy_of(trained, tmp_path / "home")
    code, out, err = run_cli(
        capsys, "--home", str(store.home), "--config", str(TINY_CONFIG), "model", "train", "--json", "--no-progress"
    )
    assert code == 0
    assert err == ""
    result = json.loads(out)
    assert set(result) == {"id", "reused", "path", "metrics"}
    assert result["id"] == trained.artifact.id
    assert result["reused"] is True
    assert result["path"] == str(store.root / KIND / trained.artifact.id)
    assert result["metrics"] == trained.artifact.metrics


def test_cli_model_train_trains_a_new_recipe(trained: Trained, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    store = copy_of(trained, tmp_path / "home")
    data = TINY_CONFIG.read_text(encoding="utf-8").replace("max_steps: 150", "max_steps: 5")
    assert data != TINY_CONFIG.read_text(encoding="utf-8")
    config_path = tmp_path / "five-steps.yaml"
    config_path.write_text(data, encoding="utf-8")
    code, out, err = run_cli(
        capsys, "--home", str(store.home), "--config", str(config_path), "model", "train", "--json", "--no-progress"
    )
    assert code == 0 and err == ""
    result = json.loads(out)
    assert result["reused"] is False
    assert result["id"] != trained.artifact.id
    assert result["id"] == store.require_current(KIND).id
    assert Path(result["path"]) == store.require_current(KIND).path
    assert result["metrics"]["steps"] == 5
    assert result["metrics"] == store.require_current(KIND).metrics


def test_cli_model_train_human_output(trained: Trained, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    store = copy_of(trained, tmp_path / "home")
    code, out, err = run_cli(capsys, "--home", str(store.home), "model", "train", "--no-progress")
    assert code == 0 and err == ""
    m = trained.artifact.metrics
    assert out.splitlines()[0] == f"model_checkpoint {trained.artifact.id} (reused)"
    assert f"validation loss {m['validation_loss']:.4f} vs unigram baseline {m['unigram_baseline_loss']:.4f}" in out
    assert f"{TINY_PARAMETERS:,} parameters, 150 steps (max_steps)" in out


def test_cli_model_train_without_a_dataset_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    code, out, err = run_cli(capsys, "--home", str(tmp_path / "empty"), "model", "train", "--json", "--no-progress")
    assert code == 1 and out == ""
    assert err.startswith("aieng: error: dataset_manifest has not been materialized")
    assert err.count("\n") == 1 and "Traceback" not in err


class _SignalingLogger:
    """A logger that sets `waiting` when a build says it waits for another trainer."""

    def __init__(self) -> None:
        self.waiting = threading.Event()
        self.lines: list[str] = []

    def info(self, message: str) -> None:
        self.lines.append(message)
        if "waiting for it, then reusing" in message:
            self.waiting.set()

    warning = info


def test_two_racing_trainings_of_one_recipe_train_once_and_the_second_reuses(trained: Trained, tmp_path: Path) -> None:
    store = copy_of(trained, tmp_path / "home")
    config = short_config(trained.config)
    first_started = threading.Event()
    second_log = _SignalingLogger()
    results: dict[str, Artifact] = {}
    second_steps: list[int] = []

    def first_on_step(step: int, record: dict) -> None:
        first_started.set()
        # Hold the first training until the second is seen waiting: the race is certain, not hoped for.
        assert second_log.waiting.wait(timeout=60), "the second build never waited for the first"

    def run(name: str, **kwargs: Any) -> None:
        results[name] = build_model_checkpoint(ArtifactStore(store.home), config, **kwargs)

    first = threading.Thread(target=run, args=("first",), kwargs={"on_step": first_on_step})
    first.start()
    assert first_started.wait(timeout=120)
    second = threading.Thread(
        target=run, args=("second",), kwargs={"on_step": lambda s, r: second_steps.append(s), "logger": second_log}
    )
    second.start()
    first.join(timeout=300)
    second.join(timeout=300)
    assert set(results) == {"first", "second"}
    assert (results["first"].reused, results["second"].reused) == (False, True)
    assert results["first"].id == results["second"].id
    assert second_steps == []  # the second never trained
    assert store.verify(store.get(KIND, results["first"].id)) == []
    assert store.require_current(KIND).id == results["first"].id

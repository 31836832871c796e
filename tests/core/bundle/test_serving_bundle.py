"""build_serving_bundle: what the bundle holds, reuse, new ids for new recipes, and refusals."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from aieng_core.bundle.serving_bundle import (
    BUNDLE_FILES,
    CODE_VERSION,
    GOLDEN_FILE,
    KIND,
    MODEL_FILES,
    SERVING_FILE,
    PartialModelRefused,
    build_serving_bundle,
    bundle_content_sha256,
    produce_bundle_files,
)
from aieng_core.hashing import sha256_file, sha256_json
from aieng_core.model.hf_files import CONFIG_FILE, GENERATION_CONFIG_FILE, MODEL_FILE
from aieng_core.store import Artifact, ArtifactSpec, ArtifactStore, DamagedInput, Produced
from aieng_core.store.artifacts import MANIFEST
from aieng_core.tokenizer.bpe import TOKENIZER_FILES
from tests.bundle_fixtures import BundledHome


def with_serving(bundled: BundledHome, **changes):
    return bundled.config.model_copy(update={"serving": bundled.config.serving.model_copy(update=changes)})


def test_bundle_holds_the_model_files_serving_json_and_goldens(serving_bundle_artifact: BundledHome) -> None:
    bundle, model = serving_bundle_artifact.bundle, serving_bundle_artifact.model
    assert MODEL_FILES == (MODEL_FILE, CONFIG_FILE, GENERATION_CONFIG_FILE, *TOKENIZER_FILES)
    assert sorted(p.name for p in bundle.path.iterdir()) == sorted([*BUNDLE_FILES, MANIFEST])
    assert set(bundle.manifest["files"]) == set(BUNDLE_FILES)
    for name in MODEL_FILES:  # byte for byte the model artifact's files
        assert bundle.file(name).read_bytes() == model.file(name).read_bytes(), name
    assert bundle.content_sha256 == bundle_content_sha256({n: sha256_file(bundle.file(n)) for n in BUNDLE_FILES})
    assert bundle.manifest["kind"] == KIND and bundle.manifest["code_version"] == CODE_VERSION


def test_serving_json_is_the_serving_config_plus_the_eos_id(serving_bundle_artifact: BundledHome) -> None:
    serving = serving_bundle_artifact.config.serving
    written = json.loads(serving_bundle_artifact.bundle.file(SERVING_FILE).read_text(encoding="utf-8"))
    config_json = json.loads(serving_bundle_artifact.model.file(CONFIG_FILE).read_text(encoding="utf-8"))
    assert written == {
        "max_batch": 16,
        "max_context": 64,
        "max_waiting": 32,
        "max_prefill_tokens": 512,
        "default_max_new_tokens": 16,
        "default_temperature": serving.default_temperature,
        "default_top_k": serving.default_top_k,
        "default_top_p": serving.default_top_p,
        "request_timeout_s": 30.0,
        "drain_timeout_s": 10.0,
        "warmup_prompt_lengths": [4, 16],
        "threads": 0,
        "device": "auto",
        "eos_token_id": config_json["eos_token_id"],
    }


def test_golden_file_records_prompts_threads_and_limits(serving_bundle_artifact: BundledHome) -> None:
    bundle = serving_bundle_artifact.bundle
    golden = json.loads(bundle.file(GOLDEN_FILE).read_text(encoding="utf-8"))
    assert golden["device"] == "cpu"
    assert golden["threads"] == bundle.manifest["metrics"]["golden_threads"] >= 1
    assert golden["engine_limits"] == {"max_batch": 16, "max_context": 64, "max_waiting": 32, "max_prefill_tokens": 512}
    assert [o["prompt"] for o in golden["outputs"]] == ["The data pipeline", "数据清洗", "A model"]
    assert all(o["max_new_tokens"] == 8 for o in golden["outputs"])


def test_manifest_inputs_recipe_and_metrics(serving_bundle_artifact: BundledHome) -> None:
    bundle, model = serving_bundle_artifact.bundle, serving_bundle_artifact.model
    assert bundle.manifest["inputs"] == [{"kind": "model_checkpoint", "id": model.id}]
    assert bundle.manifest["config_sha256"] == serving_bundle_artifact.config.section_sha256("serving")
    metrics = bundle.metrics
    assert metrics["model_checkpoint_id"] == model.id
    assert metrics["parameters"] == model.metrics["parameters"]
    assert (metrics["golden_prompts"], metrics["files"]) == (3, len(BUNDLE_FILES))
    assert metrics["bytes"] == sum(bundle.file(name).stat().st_size for name in BUNDLE_FILES)
    # fp32 keys and values: 2 layers x 16 slots x 2 kv-heads x (64 + 1 scratch) positions x 16 dims x 4 bytes, x2
    assert metrics["kv_cache_bytes"] == 2 * 2 * 16 * 2 * 65 * 16 * 4


def test_same_inputs_config_and_code_reuse_the_bundle(serving_bundle_artifact: BundledHome, copy_bundled_home) -> None:
    store = copy_bundled_home(serving_bundle_artifact)
    again = build_serving_bundle(store, serving_bundle_artifact.config)
    assert again.reused is True
    assert again.id == serving_bundle_artifact.bundle.id
    assert store.list_ids(KIND) == [again.id]
    assert store.require_current(KIND).id == again.id


@pytest.mark.parametrize(
    "changes", [{"golden_max_new_tokens": 4}, {"max_batch": 8}, {"threads": 1}], ids=["goldens", "limits", "threads"]
)
def test_a_serving_config_change_makes_a_new_bundle(
    serving_bundle_artifact: BundledHome, copy_bundled_home, changes: dict
) -> None:
    store = copy_bundled_home(serving_bundle_artifact)
    new = build_serving_bundle(store, with_serving(serving_bundle_artifact, **changes))
    assert new.reused is False
    assert new.id != serving_bundle_artifact.bundle.id
    assert store.list_ids(KIND) == sorted([new.id, serving_bundle_artifact.bundle.id])
    assert store.require_current(KIND).id == new.id
    assert store.verify(store.get(KIND, serving_bundle_artifact.bundle.id)) == []  # the old one is untouched
    if "golden_max_new_tokens" in changes:
        golden = json.loads(new.file(GOLDEN_FILE).read_text(encoding="utf-8"))
        assert [len(o["token_ids"]) <= 4 for o in golden["outputs"]] == [True] * 3


def craft_model(store: ArtifactStore, base: Artifact, name: str, metrics: dict) -> Artifact:
    """A model_checkpoint artifact with `base`'s files and other metrics, made current."""

    def produce(staging: Path) -> Produced:
        for path in base.path.iterdir():
            if path.name != MANIFEST:
                shutil.copyfile(path, staging / path.name)
        return Produced(content_sha256=base.content_sha256, metrics=metrics)

    spec = ArtifactSpec(
        kind=base.kind,
        code_version=f"crafted-{name}",
        config_sha256=base.manifest["config_sha256"],
        inputs=tuple((item["kind"], item["id"]) for item in base.manifest["inputs"]),
    )
    return store.build(spec, produce)


def test_a_partial_model_is_refused_unless_allowed(serving_bundle_artifact: BundledHome, copy_bundled_home) -> None:
    store = copy_bundled_home(serving_bundle_artifact)
    base = serving_bundle_artifact.model
    partial = craft_model(
        store, base, "partial", {**base.metrics, "partial": True, "steps": 6, "stopped_by": "max_minutes"}
    )
    with pytest.raises(PartialModelRefused) as refused:
        build_serving_bundle(store, serving_bundle_artifact.config)
    assert str(refused.value) == (
        f"model_checkpoint {partial.id} is a partial model: training stopped by max_minutes after 6 of 150 steps. "
        "Finish training first (`aieng model train`, or `dagster asset materialize -m orchestration.definitions "
        "--select model_checkpoint`: it resumes from step 6), or set serving.allow_partial_model: true to bundle it "
        "anyway"
    )
    assert isinstance(refused.value, ValueError)  # the CLI prints it as one line
    assert store.list_ids(KIND) == [serving_bundle_artifact.bundle.id]  # nothing new was written

    allowed = build_serving_bundle(store, with_serving(serving_bundle_artifact, allow_partial_model=True))
    assert allowed.manifest["inputs"] == [{"kind": "model_checkpoint", "id": partial.id}]
    assert allowed.metrics["model_checkpoint_id"] == partial.id


def test_a_damaged_model_is_not_bundled(serving_bundle_artifact: BundledHome, copy_bundled_home) -> None:
    store = copy_bundled_home(serving_bundle_artifact)
    weights = store.require_current("model_checkpoint").file(MODEL_FILE)
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01
    weights.write_bytes(bytes(data))
    with pytest.raises(DamagedInput) as damaged:
        build_serving_bundle(store, with_serving(serving_bundle_artifact, max_batch=4))
    assert f"{weights}: sha256 does not match the manifest" in str(damaged.value)
    assert store.list_ids(KIND) == [serving_bundle_artifact.bundle.id]


def test_produce_bundle_files_needs_only_the_model_directory(
    serving_bundle_artifact: BundledHome, tmp_path: Path
) -> None:
    """The serving benchmark bundles a model artifact of its own, outside any store."""
    model = serving_bundle_artifact.model
    alone = tmp_path / "somewhere" / "model"
    shutil.copytree(model.path, alone)
    manifest = json.loads((alone / MANIFEST).read_text(encoding="utf-8"))
    staging = tmp_path / "staging"
    staging.mkdir()
    threads = serving_bundle_artifact.bundle.metrics["golden_threads"]
    produced = produce_bundle_files(
        staging,
        Artifact("model_checkpoint", model.id, alone, manifest),
        serving_bundle_artifact.config.serving,
        threads,
    )
    assert sorted(p.name for p in staging.iterdir()) == sorted(BUNDLE_FILES)
    bundle = serving_bundle_artifact.bundle
    for name in BUNDLE_FILES:
        assert (staging / name).read_bytes() == bundle.file(name).read_bytes(), name
    assert produced.content_sha256 == bundle.content_sha256
    assert produced.metrics == bundle.metrics


def test_a_context_beyond_the_model_is_refused(serving_bundle_artifact: BundledHome, tmp_path: Path) -> None:
    serving = serving_bundle_artifact.config.serving.model_copy(update={"max_context": 128})
    with pytest.raises(ValueError, match=r"serving.max_context \(128\) exceeds the model's max_position_embeddings"):
        produce_bundle_files(tmp_path, serving_bundle_artifact.model, serving, 1)


def test_content_hash_is_of_the_file_hashes(serving_bundle_artifact: BundledHome) -> None:
    files = serving_bundle_artifact.bundle.manifest["files"]
    assert bundle_content_sha256(files) == sha256_json(files)

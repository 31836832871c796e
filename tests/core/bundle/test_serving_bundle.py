"""build_serving_bundle: what the bundle holds, reuse, new ids for new recipes, and refusals."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from aieng_core.benchmark.benchmark_report import REPORT_FILE, build_benchmark_report
from aieng_core.bundle.serving_bundle import (
    BENCHMARK_FILE,
    BUNDLE_FILES,
    CODE_VERSION,
    GOLDEN_FILE,
    KIND,
    MODEL_FILES,
    SERVING_FILE,
    BenchmarkReportMismatch,
    PartialModelRefused,
    build_serving_bundle,
    bundle_content_sha256,
    produce_bundle_files,
)
from aieng_core.hashing import sha256_file, sha256_json
from aieng_core.model.hf_files import CONFIG_FILE, GENERATION_CONFIG_FILE, MODEL_FILE
from aieng_core.store import Artifact, ArtifactNotFound, DamagedInput
from aieng_core.store.artifacts import MANIFEST
from aieng_core.tokenizer.bpe import TOKENIZER_CONFIG_FILE, TOKENIZER_FILES
from tests.bundle_fixtures import BundledHome, craft_model


def with_recipe(bundled: BundledHome, **changes):
    return bundled.config.model_copy(update={"bundle": bundled.config.bundle.model_copy(update=changes)})


def with_serving(bundled: BundledHome, **changes):
    return bundled.config.model_copy(update={"serving": bundled.config.serving.model_copy(update=changes)})


def test_bundle_holds_the_model_files_serving_json_goldens_and_benchmark(
    serving_bundle_artifact: BundledHome, benchmark_report_artifact: Artifact
) -> None:
    bundle, model = serving_bundle_artifact.bundle, serving_bundle_artifact.model
    assert MODEL_FILES == (MODEL_FILE, CONFIG_FILE, GENERATION_CONFIG_FILE, *TOKENIZER_FILES)
    assert BENCHMARK_FILE == REPORT_FILE == "benchmark.json"
    assert sorted(p.name for p in bundle.path.iterdir()) == sorted([*BUNDLE_FILES, BENCHMARK_FILE, MANIFEST])
    assert set(bundle.manifest["files"]) == {*BUNDLE_FILES, BENCHMARK_FILE}
    for name in MODEL_FILES:  # byte for byte the model artifact's files, but for the chat template
        if name == TOKENIZER_CONFIG_FILE:
            served = json.loads(bundle.file(name).read_text(encoding="utf-8"))
            assert served.pop("chat_template") == serving_bundle_artifact.config.bundle.chat_template
            assert served == json.loads(model.file(name).read_text(encoding="utf-8"))
            continue
        assert bundle.file(name).read_bytes() == model.file(name).read_bytes(), name
    assert bundle.file(BENCHMARK_FILE).read_bytes() == benchmark_report_artifact.file(REPORT_FILE).read_bytes()
    # The content hash is of the served files; benchmark.json is listed (and verified) beside them.
    assert bundle.content_sha256 == bundle_content_sha256({n: sha256_file(bundle.file(n)) for n in BUNDLE_FILES})
    assert bundle.manifest["kind"] == KIND and bundle.manifest["code_version"] == CODE_VERSION


def test_serving_json_is_the_bundle_recipe_plus_the_eos_id(serving_bundle_artifact: BundledHome) -> None:
    """Engine limits and request defaults, nothing the running server decides (serving:)."""
    recipe = serving_bundle_artifact.config.bundle
    written = json.loads(serving_bundle_artifact.bundle.file(SERVING_FILE).read_text(encoding="utf-8"))
    config_json = json.loads(serving_bundle_artifact.model.file(CONFIG_FILE).read_text(encoding="utf-8"))
    assert written == {
        "max_batch": 16,
        "max_context": 64,
        "max_prefill_tokens": 512,
        "default_max_new_tokens": 16,
        "default_temperature": recipe.default_temperature,
        "default_top_k": recipe.default_top_k,
        "default_top_p": recipe.default_top_p,
        "eos_token_id": config_json["eos_token_id"],
    }


def test_golden_file_records_prompts_threads_and_limits(serving_bundle_artifact: BundledHome) -> None:
    bundle = serving_bundle_artifact.bundle
    golden = json.loads(bundle.file(GOLDEN_FILE).read_text(encoding="utf-8"))
    assert golden["device"] == "cpu"
    assert golden["threads"] == bundle.manifest["metrics"]["golden_threads"] >= 1
    # Every golden waits at once: the server's queue length is not the bundle's to record.
    assert golden["engine_limits"] == {"max_batch": 16, "max_context": 64, "max_waiting": 5, "max_prefill_tokens": 512}
    assert [o["prompt"] for o in golden["outputs"][:3]] == ["The data pipeline", "数据清洗", "A model"]
    assert [o["prompt"] for o in golden["outputs"][3:]] == [
        "### user\nWhat does the pipeline do?\n\n### assistant\n",
        "### system\nBe brief.\n\n### user\n数据清洗?\n\n### assistant\n",
    ]
    assert all(o["max_new_tokens"] == 8 for o in golden["outputs"])


def test_manifest_inputs_recipe_and_metrics(
    serving_bundle_artifact: BundledHome, benchmark_report_artifact: Artifact
) -> None:
    bundle, model, report = serving_bundle_artifact.bundle, serving_bundle_artifact.model, benchmark_report_artifact
    assert bundle.manifest["inputs"] == [
        {"kind": "model_checkpoint", "id": model.id},
        {"kind": "benchmark_report", "id": report.id},
    ]
    # The bundle: section without `weights` (fp32): float32 bundles keep the ids they had before it.
    recipe = serving_bundle_artifact.config.bundle.model_dump(mode="json")
    assert recipe.pop("weights") == "fp32"
    assert bundle.manifest["config_sha256"] == sha256_json(recipe)
    metrics = bundle.metrics
    assert metrics["model_checkpoint_id"] == model.id
    # The report's figures ride along.
    assert metrics["benchmark_report_id"] == report.id
    assert metrics["benchmark"] == report.metrics
    assert metrics["benchmark"]["model_checkpoint_id"] == model.id
    assert metrics["parameters"] == model.metrics["parameters"]
    assert (metrics["golden_prompts"], metrics["golden_conversations"], metrics["files"]) == (
        3,
        2,
        len(BUNDLE_FILES) + 1,
    )
    assert metrics["bytes"] == sum(bundle.file(name).stat().st_size for name in bundle.manifest["files"])
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
    "changes",
    [
        {"golden_max_new_tokens": 4},
        {"max_batch": 8},
        {"golden_threads": 1},
        {"default_temperature": 0.7},
        {"chat_template": "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"},
    ],
    ids=["goldens", "limits", "golden-threads", "request-defaults", "chat-template"],
)
def test_a_recipe_change_makes_a_new_bundle(
    serving_bundle_artifact: BundledHome, copy_bundled_home, changes: dict
) -> None:
    store = copy_bundled_home(serving_bundle_artifact)
    new = build_serving_bundle(store, with_recipe(serving_bundle_artifact, **changes))
    assert new.reused is False
    assert new.id != serving_bundle_artifact.bundle.id
    assert store.list_ids(KIND) == sorted([new.id, serving_bundle_artifact.bundle.id])
    assert store.require_current(KIND).id == new.id
    assert store.verify(store.get(KIND, serving_bundle_artifact.bundle.id)) == []  # the old one is untouched
    if "golden_max_new_tokens" in changes:
        golden = json.loads(new.file(GOLDEN_FILE).read_text(encoding="utf-8"))
        assert [len(o["token_ids"]) <= 4 for o in golden["outputs"]] == [True] * 5
    if "chat_template" in changes:
        tokenizer_config = json.loads(new.file("tokenizer_config.json").read_text(encoding="utf-8"))
        assert tokenizer_config["chat_template"] == changes["chat_template"]
        golden = json.loads(new.file(GOLDEN_FILE).read_text(encoding="utf-8"))
        assert [o["prompt"] for o in golden["outputs"][3:]] == [
            "What does the pipeline do?\n",
            "Be brief.\n数据清洗?\n",
        ]


def test_a_recipe_key_the_report_does_not_read_keeps_the_report(
    serving_bundle_artifact: BundledHome, benchmark_report_artifact: Artifact, copy_bundled_home
) -> None:
    store = copy_bundled_home(serving_bundle_artifact)
    config = with_recipe(serving_bundle_artifact, default_temperature=0.7, golden_threads=1)
    assert build_benchmark_report(store, config).id == benchmark_report_artifact.id
    assert build_benchmark_report(store, with_recipe(serving_bundle_artifact, max_prefill_tokens=64)).id != (
        benchmark_report_artifact.id
    )


@pytest.mark.parametrize(
    "changes",
    [
        {"max_waiting": 7},
        {"request_timeout_s": 1.5},
        {"max_request_bytes": 4096},
        {"drain_timeout_s": 0.0},
        {"threads": 1},
        {"device": "cpu"},
        {"warmup_prompt_lengths": (2,)},
    ],
    ids=lambda changes: next(iter(changes)),
)
def test_a_runtime_change_keeps_the_bundle_and_its_report(
    serving_bundle_artifact: BundledHome, benchmark_report_artifact: Artifact, copy_bundled_home, changes: dict
) -> None:
    """What only the running server reads never reaches an id: raising the body limit restarts
    a server, it does not re-measure the report, rebuild the bundle or re-gate it."""
    store = copy_bundled_home(serving_bundle_artifact)
    config = with_serving(serving_bundle_artifact, **changes)
    report = build_benchmark_report(store, config)
    bundle = build_serving_bundle(store, config)
    assert (report.reused, report.id) == (True, benchmark_report_artifact.id)
    assert (bundle.reused, bundle.id) == (True, serving_bundle_artifact.bundle.id)
    assert store.list_ids(KIND) == [serving_bundle_artifact.bundle.id]


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
        "--select model_checkpoint`: it resumes from step 6), or set bundle.allow_partial_model: true to bundle it "
        "anyway"
    )
    assert isinstance(refused.value, ValueError)  # the CLI prints it as one line
    assert store.list_ids(KIND) == [serving_bundle_artifact.bundle.id]  # nothing new was written

    allowed_config = with_recipe(serving_bundle_artifact, allow_partial_model=True)
    report = build_benchmark_report(store, allowed_config)  # the partial model's own report
    allowed = build_serving_bundle(store, allowed_config)
    assert allowed.manifest["inputs"] == [
        {"kind": "model_checkpoint", "id": partial.id},
        {"kind": "benchmark_report", "id": report.id},
    ]
    assert allowed.metrics["model_checkpoint_id"] == partial.id
    assert report.metrics["model_checkpoint_id"] == partial.id


def test_a_damaged_model_is_not_bundled(serving_bundle_artifact: BundledHome, copy_bundled_home) -> None:
    store = copy_bundled_home(serving_bundle_artifact)
    weights = store.require_current("model_checkpoint").file(MODEL_FILE)
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01
    weights.write_bytes(bytes(data))
    with pytest.raises(DamagedInput) as damaged:
        build_serving_bundle(store, with_recipe(serving_bundle_artifact, max_batch=4))
    assert f"{weights}: sha256 does not match the manifest" in str(damaged.value)
    assert store.list_ids(KIND) == [serving_bundle_artifact.bundle.id]


def test_produce_bundle_files_needs_only_the_artifacts_directories(
    serving_bundle_artifact: BundledHome, benchmark_report_artifact: Artifact, tmp_path: Path
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
        serving_bundle_artifact.config.bundle,
        threads,
        benchmark_report_artifact,
    )
    assert sorted(p.name for p in staging.iterdir()) == sorted([*BUNDLE_FILES, BENCHMARK_FILE])
    bundle = serving_bundle_artifact.bundle
    for name in [*BUNDLE_FILES, BENCHMARK_FILE]:
        assert (staging / name).read_bytes() == bundle.file(name).read_bytes(), name
    assert produced.content_sha256 == bundle.content_sha256
    assert produced.metrics == bundle.metrics

    # Without a report (the serving benchmark's bundles): the served files only, the same content hash.
    bare = tmp_path / "bare"
    bare.mkdir()
    produced = produce_bundle_files(
        bare, Artifact("model_checkpoint", model.id, alone, manifest), serving_bundle_artifact.config.bundle, threads
    )
    assert sorted(p.name for p in bare.iterdir()) == sorted(BUNDLE_FILES)
    assert produced.content_sha256 == bundle.content_sha256
    assert "benchmark" not in produced.metrics and produced.metrics["files"] == len(BUNDLE_FILES)


def test_a_context_beyond_the_model_is_refused(serving_bundle_artifact: BundledHome, tmp_path: Path) -> None:
    recipe = serving_bundle_artifact.config.bundle.model_copy(update={"max_context": 128})
    with pytest.raises(ValueError, match=r"bundle.max_context \(128\) exceeds the model's max_position_embeddings"):
        produce_bundle_files(tmp_path, serving_bundle_artifact.model, recipe, 1)


def test_content_hash_is_of_the_file_hashes(serving_bundle_artifact: BundledHome) -> None:
    files = serving_bundle_artifact.bundle.manifest["files"]
    assert bundle_content_sha256(files) == sha256_json(files)


def test_a_report_of_another_model_is_refused_naming_both(
    serving_bundle_artifact: BundledHome, copy_bundled_home, tmp_path: Path
) -> None:
    store = copy_bundled_home(serving_bundle_artifact)
    base = serving_bundle_artifact.model
    other = craft_model(store, base, "other", base.metrics)  # now the current model; the report is base's
    report = store.require_current("benchmark_report")
    with pytest.raises(BenchmarkReportMismatch) as refused:
        build_serving_bundle(store, serving_bundle_artifact.config)
    assert str(refused.value) == (
        f"benchmark_report {report.id} measured model_checkpoint {base.id}, not {other.id}, the model this bundle "
        "would pack: a bundle carries the report of its own model. Materialize benchmark_report for it first "
        "(`dagster asset materialize -m orchestration.definitions --select benchmark_report`), then retry"
    )
    assert isinstance(refused.value, ValueError)  # the CLI prints it as one line
    assert store.list_ids(KIND) == [serving_bundle_artifact.bundle.id]  # nothing new was written
    # produce_bundle_files refuses it too, whoever calls it.
    with pytest.raises(BenchmarkReportMismatch):
        produce_bundle_files(tmp_path, other, serving_bundle_artifact.config.bundle, 1, report)
    assert list(tmp_path.glob("*.json")) == []  # refused before anything was written


def test_without_a_benchmark_report_the_bundle_says_how_to_make_one(
    serving_bundle_artifact: BundledHome, copy_bundled_home
) -> None:
    store = copy_bundled_home(serving_bundle_artifact)
    shutil.rmtree(store.refs / "benchmark_report")
    with pytest.raises(ArtifactNotFound) as missing:
        build_serving_bundle(store, with_recipe(serving_bundle_artifact, max_batch=4))
    assert str(missing.value) == (
        "benchmark_report has not been materialized yet: a bundle carries its model's benchmark report. Materialize "
        "it first (`dagster asset materialize -m orchestration.definitions --select benchmark_report`), then retry"
    )
    assert store.list_ids(KIND) == [serving_bundle_artifact.bundle.id]


def test_a_damaged_report_is_not_bundled(serving_bundle_artifact: BundledHome, copy_bundled_home) -> None:
    store = copy_bundled_home(serving_bundle_artifact)
    report = store.require_current("benchmark_report").file(REPORT_FILE)
    report.write_text(report.read_text(encoding="utf-8").replace('"truncated": false', '"truncated": true'))
    with pytest.raises(DamagedInput) as damaged:
        build_serving_bundle(store, with_recipe(serving_bundle_artifact, max_batch=4))
    assert f"{report}: sha256 does not match the manifest" in str(damaged.value)
    assert store.list_ids(KIND) == [serving_bundle_artifact.bundle.id]


def test_a_new_measurement_under_the_same_report_id_makes_another_bundle(
    serving_bundle_artifact: BundledHome, copy_bundled_home
) -> None:
    """A report measured again (its artifact removed) keeps its id but not its figures: the bundle
    carrying the new figures is another bundle."""
    store = copy_bundled_home(serving_bundle_artifact)
    old = store.require_current("benchmark_report")
    shutil.rmtree(old.path)
    again = build_benchmark_report(store, serving_bundle_artifact.config)
    assert (again.id, again.reused) == (old.id, False)
    assert again.content_sha256 != old.content_sha256  # timings differ from run to run
    bundle = build_serving_bundle(store, serving_bundle_artifact.config)
    assert bundle.id != serving_bundle_artifact.bundle.id
    assert bundle.content_sha256 == serving_bundle_artifact.bundle.content_sha256  # the same served files
    assert bundle.file(BENCHMARK_FILE).read_bytes() == again.file(REPORT_FILE).read_bytes()

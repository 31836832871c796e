"""bundle.weights: int8: the int8 variant bundle built from its float32 source, its figures
(greedy agreement, bits per byte), the report beside it, the refusal beyond the margin, and
a rebuild giving the same bytes."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from aieng_core.benchmark.benchmark_report import BUNDLE_KEYS, build_benchmark_report, read_report, report_config_sha256
from aieng_core.bundle.int8_variant import int8_refusal, is_variant
from aieng_core.bundle.serving_bundle import GOLDEN_FILE, SERVING_FILE, build_serving_bundle
from aieng_core.bundle.verify import load_bundle, verify_bundle
from aieng_core.config import AiengConfig
from aieng_core.gate.quality import quality_step
from aieng_core.gate.report import GateFailed
from aieng_core.hashing import sha256_json
from aieng_core.model import int8_weights
from aieng_core.model.int8_weights import METHOD
from aieng_core.serving.greedy import golden_agreement
from aieng_core.store import Artifact, ArtifactIntegrityError, ArtifactStore
from aieng_core.store.artifacts import MANIFEST
from aieng_core.training.held_out_text import dataset_of, held_out_text, model_bits, verified_dataset
from tests.bundle_fixtures import TrainedHome


@dataclass(frozen=True)
class Variant:
    store: ArtifactStore
    config: AiengConfig
    report: Artifact
    source: Artifact
    bundle: Artifact


def int8_config(config: AiengConfig, **gate: float) -> AiengConfig:
    return config.model_copy(
        update={
            "bundle": config.bundle.model_copy(update={"weights": "int8"}),
            "gate": config.gate.model_copy(update=gate),
        }
    )


def build_variant(trained_home: TrainedHome, home: Path) -> Variant:
    shutil.copytree(trained_home.home, home)
    store = ArtifactStore(home)
    store.set_current(trained_home.model)
    config = int8_config(trained_home.config)
    report = build_benchmark_report(store, config)
    bundle = build_serving_bundle(store, config)
    [source_id] = bundle.input_ids("serving_bundle")
    return Variant(store, config, report, store.get("serving_bundle", source_id), bundle)


@pytest.fixture(scope="module")
def variant(trained_home: TrainedHome, tmp_path_factory: pytest.TempPathFactory) -> Variant:
    return build_variant(trained_home, tmp_path_factory.mktemp("int8") / "home")


def test_the_variant_names_its_float32_source_and_the_method(variant: Variant) -> None:
    bundle, source = variant.bundle, variant.source
    assert variant.store.require_current("serving_bundle").id == bundle.id
    assert bundle.manifest["inputs"] == [{"kind": "serving_bundle", "id": source.id}]
    assert not is_variant(source) and is_variant(bundle)
    assert source.manifest["inputs"] == [
        {"kind": "model_checkpoint", "id": variant.report.metrics["model_checkpoint_id"]},
        {"kind": "benchmark_report", "id": variant.report.id},
    ]
    metrics = bundle.metrics
    assert (metrics["weights"], metrics["weights_method"], metrics["source_bundle_id"]) == ("int8", METHOD, source.id)
    assert metrics["model_checkpoint_id"] == source.metrics["model_checkpoint_id"]
    assert metrics["model_bytes"] < 0.7 * metrics["source_model_bytes"]
    serving = json.loads(bundle.file(SERVING_FILE).read_text(encoding="utf-8"))
    assert (serving["weights"], serving["weights_method"]) == ("int8", METHOD)
    lineage = source.manifest["lineage"]
    assert bundle.manifest["lineage"] == {**lineage, "artifacts": lineage["artifacts"] + 1}  # the source too


def test_the_variant_verifies_and_loads_as_int8(variant: Variant) -> None:
    report = verify_bundle(variant.bundle.path)
    assert report["ok"], report["problems"]
    recipe = variant.config.bundle
    assert len(report["goldens"]) == len(recipe.golden_prompts) + len(recipe.golden_conversations)
    loaded = load_bundle(variant.bundle.path)
    assert int8_weights.is_int8_model(loaded.model)


def test_golden_agreement_is_that_of_the_two_golden_files(variant: Variant) -> None:
    fp32 = json.loads(variant.source.file(GOLDEN_FILE).read_text(encoding="utf-8"))["outputs"]
    int8 = json.loads(variant.bundle.file(GOLDEN_FILE).read_text(encoding="utf-8"))["outputs"]
    recorded = variant.bundle.metrics["golden_agreement"]
    assert recorded == golden_agreement(fp32, int8)
    assert recorded["prompts"] == len(fp32)
    assert recorded["identical"] == sum(a["token_ids"] == b["token_ids"] for a, b in zip(fp32, int8))


def test_golden_agreement_counts_tokens_before_the_first_divergence() -> None:
    fp32 = [{"prompt": "a", "token_ids": [1, 2, 3, 4]}, {"prompt": "b", "token_ids": [5, 6]}]
    int8 = [{"prompt": "a", "token_ids": [1, 2, 9, 4]}, {"prompt": "b", "token_ids": [5, 6]}]
    agreement = golden_agreement(fp32, int8)
    assert (agreement["identical"], agreement["tokens"], agreement["tokens_agreeing"]) == (1, 6, 4)
    assert agreement["token_agreement"] == pytest.approx(4 / 6)


def test_the_recorded_bits_per_byte_are_the_gates_measure_of_both_bundles(variant: Variant) -> None:
    fp32, int8 = load_bundle(variant.source.path), load_bundle(variant.bundle.path)
    text = held_out_text(verified_dataset(variant.store, dataset_of(fp32)), fp32, "held_out_validation")
    quality = variant.bundle.metrics["int8_quality"]
    assert quality["text"] == text.summary()
    assert quality["fp32_bits_per_byte"] == model_bits(fp32, text.documents)[0] / text.bytes
    assert quality["int8_bits_per_byte"] == model_bits(int8, text.documents)[0] / text.bytes
    assert quality["worse_by"] == pytest.approx(quality["int8_bits_per_byte"] / quality["fp32_bits_per_byte"] - 1)
    # int8 per-channel costs little on this model, well within the default margin.
    assert abs(quality["worse_by"]) < variant.config.gate.int8_max_quality_regression


def test_the_report_shows_int8_beside_float32(variant: Variant, trained_home: TrainedHome) -> None:
    report = read_report(variant.report)
    int8 = report["int8"]
    assert int8["method"] == METHOD
    assert int8["quality"]["windows"] == report["quality"]["windows"]
    assert [row["batch_size"] for row in report["throughput"]] == list(variant.config.benchmark.batch_sizes)
    for row in report["throughput"]:
        assert row["int8"]["tokens_per_second"] > 0
        assert row["ratio_int8_vs_ours"] == row["int8"]["tokens_per_second"] / row["ours"]["tokens_per_second"]
    metrics = variant.report.metrics
    assert metrics["int8_validation_loss"] == int8["quality"]["validation_loss"]
    # The variant carries the same report, byte for byte.
    assert variant.bundle.file("benchmark.json").read_bytes() == variant.report.file("benchmark.json").read_bytes()
    # A float32 config's report: no int8 side, and its id hashes the bundle keys it always did.
    fp32_config = trained_home.config
    recipe = fp32_config.bundle.model_dump(mode="json")
    assert report_config_sha256(fp32_config) == sha256_json(
        {
            "benchmark": fp32_config.benchmark.model_dump(mode="json"),
            "bundle": {key: recipe[key] for key in BUNDLE_KEYS},
            "training": fp32_config.training.model_dump(mode="json"),
        }
    )
    assert report_config_sha256(variant.config) != report_config_sha256(fp32_config)


def test_building_again_reuses_and_a_rebuild_gives_the_same_bytes(variant: Variant) -> None:
    from aieng_core.cli.rebuild import builders, config_loader
    from aieng_core.store.rebuild import rebuild
    from tests.conftest import TINY_CONFIG

    again = build_serving_bundle(variant.store, variant.config)
    assert (again.id, again.reused) == (variant.bundle.id, True)
    # Gone from the store: `aieng store rebuild` builds it again from the recipe it recorded.
    moved = variant.bundle.path.with_name(variant.bundle.id + ".kept")
    variant.bundle.path.rename(moved)
    try:
        result = rebuild(variant.store, variant.bundle.id, builders(), config_loader(str(TINY_CONFIG)))
        assert result["id"] == variant.bundle.id
        assert result["content_sha256"] == variant.bundle.content_sha256
        for name in ("model.safetensors", "golden.json", "serving.json"):
            assert (variant.bundle.path / name).read_bytes() == (moved / name).read_bytes(), name
    finally:
        if moved.exists():
            shutil.rmtree(variant.bundle.path, ignore_errors=True)
            moved.rename(variant.bundle.path)


def test_int8_refusal_is_beyond_the_margin_only() -> None:
    quality = {"source_bundle_id": "f" * 16, "fp32_bits_per_byte": 2.0, "int8_bits_per_byte": 2.03, "worse_by": 0.015}
    assert int8_refusal(quality, 0.02) is None
    assert int8_refusal(quality, 0.015) is None
    reason = int8_refusal(quality, 0.01)
    assert reason == (
        "the int8 variant's 2.0300 bits per byte on the held-out text is 1.50% above its float32 source's 2.0000 "
        f"({'f' * 16}); gate.int8_max_quality_regression allows 1.00%"
    )
    # A figure that cannot be compared is refused, never waved through (NaN > margin is False).
    for worse in (float("nan"), float("inf"), None):
        assert "cannot be judged" in str(int8_refusal({**quality, "worse_by": worse}, 0.01))
    assert "cannot be judged" in str(int8_refusal({}, 0.01))


def rewrite_manifest(path: Path, change) -> None:
    """Change a bundle's manifest.json in place (its metrics are outside every file hash)."""
    manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    change(manifest)
    (path / MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")


def test_a_damaging_quantization_is_refused_by_the_gate_whatever_its_manifest_says(
    trained_home: TrainedHome, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    honest = int8_weights.quantize_rows

    def damaging(weight):  # every scale off by half: the model's predictions fall apart
        values, scale = honest(weight)
        return values, scale * 0.5

    monkeypatch.setattr(int8_weights, "quantize_rows", damaging)
    damaged = build_variant(trained_home, tmp_path / "home")
    monkeypatch.undo()
    recorded = damaged.bundle.metrics["int8_quality"]
    margin = damaged.config.gate.int8_max_quality_regression
    assert recorded["worse_by"] > margin
    assert verify_bundle(damaged.bundle.path)["ok"]  # intact: its goldens are its own
    # The recorded figures are a record: the gate scores both bundles again, so figures edited
    # in the manifest (outside every file hash) change nothing.
    rewrite_manifest(damaged.bundle.path, lambda m: m["metrics"]["int8_quality"].update(worse_by=0.0))
    with pytest.raises(GateFailed) as refused:
        quality_step(damaged.bundle.path, damaged.store, None, damaged.config)
    assert (refused.value.step, refused.value.figure) == ("quality", "int8_bits_per_byte")
    measured = refused.value.figures["int8"]
    assert measured["worse_by"] == recorded["worse_by"]
    assert measured["source_bundle_id"] == damaged.source.id
    assert refused.value.reason == int8_refusal(measured, margin)


def test_the_gate_refuses_a_variant_whose_source_is_not_the_one_it_names(variant: Variant, tmp_path: Path) -> None:
    home = tmp_path / "home"
    shutil.copytree(variant.store.home, home)
    store = ArtifactStore(home)
    path = store.get("serving_bundle", variant.bundle.id).path
    rewrite_manifest(path, lambda m: m["metrics"].update(source_bundle_id="0" * 16))
    with pytest.raises(ArtifactIntegrityError, match="names one float32 serving_bundle as its input"):
        quality_step(path, store, None, variant.config)


def test_serving_json_and_the_weights_file_must_agree(variant: Variant, tmp_path: Path) -> None:
    from aieng_core.bundle.serving_bundle import BUNDLE_FILES, bundle_content_sha256
    from aieng_core.bundle.verify import BundleVerificationError
    from aieng_core.hashing import sha256_file

    path = tmp_path / "bundle"
    shutil.copytree(variant.bundle.path, path)
    serving = json.loads((path / SERVING_FILE).read_text(encoding="utf-8"))
    (path / SERVING_FILE).write_text(json.dumps({**serving, "weights": "fp32"}), encoding="utf-8")

    def rehash(manifest: dict) -> None:  # a consistent manifest: only the two files disagree
        manifest["files"][SERVING_FILE] = sha256_file(path / SERVING_FILE)
        manifest["content_sha256"] = bundle_content_sha256({n: manifest["files"][n] for n in BUNDLE_FILES})

    rewrite_manifest(path, rehash)
    with pytest.raises(BundleVerificationError, match="weights 'fp32', but model.safetensors holds 'int8'"):
        load_bundle(path, check_goldens=False)


def test_a_failed_variant_build_leaves_the_current_bundle_as_it_was(
    variant: Variant, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:

    home = tmp_path / "home"
    shutil.copytree(variant.store.home, home)
    store = ArtifactStore(home)
    assert store.current("serving_bundle").id == variant.bundle.id
    before = set(store.list_ids("serving_bundle"))

    def fails(*args, **kwargs):
        raise RuntimeError("disk full while quantizing")

    monkeypatch.setattr("aieng_core.model.hf_files.save_int8_weights", fails)
    # Another bundle section: a new float32 source is built, then its variant fails.
    config = variant.config.model_copy(
        update={"bundle": variant.config.bundle.model_copy(update={"default_max_new_tokens": 17})}
    )
    with pytest.raises(RuntimeError, match="disk full while quantizing"):
        build_serving_bundle(store, config)
    assert store.current("serving_bundle").id == variant.bundle.id
    [new_source] = set(store.list_ids("serving_bundle")) - before  # kept, for the next try to reuse
    assert not is_variant(store.get("serving_bundle", new_source))


def test_a_variant_is_not_made_from_a_variant(variant: Variant, tmp_path: Path) -> None:
    from aieng_core.bundle.int8_variant import produce_variant_files

    staging = tmp_path / "staging"
    staging.mkdir()
    with pytest.raises(ValueError, match="is an int8 variant itself"):
        produce_variant_files(staging, variant.store, variant.bundle, 1)


def test_the_cli_says_what_the_variant_is(variant: Variant) -> None:
    from aieng_core.cli.bundle import int8_lines

    metrics = variant.bundle.metrics
    quality, agreement = metrics["int8_quality"], metrics["golden_agreement"]
    assert int8_lines(metrics).splitlines() == [
        f"  int8 variant of serving_bundle {variant.source.id} ({METHOD})",
        f"  bits per byte on the held-out text: {quality['int8_bits_per_byte']:.4f} int8 vs "
        f"{quality['fp32_bits_per_byte']:.4f} float32 ({quality['worse_by']:+.2%})",
        f"  greedy goldens identical to float32: {agreement['identical']}/{agreement['prompts']} "
        f"({agreement['token_agreement']:.0%} of tokens before the first divergence)",
    ]
    assert int8_lines(variant.source.metrics) == ""


def test_a_server_on_the_variant_answers_and_says_int8(variant: Variant) -> None:
    from aieng_core.serving.http.app import create_app
    from tests.core.serving.http_helpers import serving

    app = create_app(variant.bundle.path, variant.config, admin_token=None)
    with serving(app) as server:
        version = server.get("/version").json
        assert (version["bundle_id"], version["weights"]) == (variant.bundle.id, "int8")
        assert version["inputs"] == [{"kind": "serving_bundle", "id": variant.source.id}]
        golden = json.loads(variant.bundle.file(GOLDEN_FILE).read_text(encoding="utf-8"))["outputs"][0]
        reply = server.post("/generate", {"prompt": golden["prompt"], "max_new_tokens": golden["max_new_tokens"]})
        assert reply.status == 200 and reply.headers["x-aieng-bundle-id"] == variant.bundle.id
        assert reply.json["token_ids"] == golden["token_ids"]

"""verify_bundle / load_bundle: every file re-hashed, the model loaded, every golden replayed;
each failure names the file or the prompt that differs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from aieng_core.bundle.serving_bundle import BUNDLE_FILES, GOLDEN_FILE, SERVING_FILE, bundle_content_sha256
from aieng_core.bundle.verify import BundleVerificationError, LoadedBundle, file_problems, load_bundle, verify_bundle
from aieng_core.hashing import sha256_file
from aieng_core.serving.request import SamplingParams
from aieng_core.store import ArtifactIntegrityError
from aieng_core.store.artifacts import MANIFEST
from tests.bundle_fixtures import BundledHome


def flip_one_byte(path: Path, at: int = -1) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01
    path.write_bytes(bytes(data))


def rehash(bundle: Path, name: str) -> None:
    """Make the manifest agree with the file as it is now (as someone covering tracks would)."""
    manifest = json.loads((bundle / MANIFEST).read_text(encoding="utf-8"))
    manifest["files"][name] = sha256_file(bundle / name)
    manifest["content_sha256"] = bundle_content_sha256({n: manifest["files"][n] for n in BUNDLE_FILES})
    (bundle / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True), encoding="utf-8")


def test_an_intact_bundle_verifies(serving_bundle_artifact: BundledHome) -> None:
    bundle = serving_bundle_artifact.bundle
    golden = json.loads(bundle.file(GOLDEN_FILE).read_text(encoding="utf-8"))["outputs"]
    report = verify_bundle(bundle.path)
    assert report == {
        "bundle_id": bundle.id,
        "path": str(bundle.path),
        "ok": True,
        "problems": [],
        "files_checked": len(BUNDLE_FILES) + 1,  # and benchmark.json
        "goldens": [
            {
                "prompt": g["prompt"],
                "conversation": "messages" in g,
                "ok": True,
                "expected_text": g["text"],
                "got_text": g["text"],
            }
            for g in golden
        ],
    }


def test_load_bundle_gives_a_working_engine(serving_bundle_artifact: BundledHome) -> None:
    bundle = serving_bundle_artifact.bundle
    loaded = load_bundle(bundle.path)
    assert isinstance(loaded, LoadedBundle)
    assert (loaded.bundle_id, loaded.path, loaded.manifest) == (bundle.id, bundle.path, bundle.manifest)
    assert loaded.serving == json.loads(bundle.file(SERVING_FILE).read_text(encoding="utf-8"))
    assert loaded.eos_token_id == loaded.serving["eos_token_id"] == loaded.model.config.eos_token_id
    engine = loaded.make_engine(max_waiting=32)  # the queue is the server's (serving.max_waiting)
    assert (engine.limits.max_batch, engine.limits.max_context, engine.limits.max_waiting) == (16, 64, 32)
    assert engine.limits.max_prefill_tokens == 512
    outputs = engine.generate([g["prompt"] for g in loaded.golden], SamplingParams(max_new_tokens=8))
    assert [list(o.token_ids) for o in outputs] == [g["token_ids"] for g in loaded.golden]


@pytest.mark.parametrize(
    "name", ["model.safetensors", "tokenizer.json", "serving.json", "config.json", "golden.json", "benchmark.json"]
)
def test_one_changed_byte_is_named(serving_bundle_artifact: BundledHome, copy_bundle, name: str) -> None:
    path = copy_bundle(serving_bundle_artifact.bundle)
    flip_one_byte(path / name, at=len((path / name).read_bytes()) // 2)
    expected = f"{path / name}: sha256 does not match the manifest"
    report = verify_bundle(path)
    assert (report["ok"], report["problems"], report["goldens"]) == (False, [expected], [])
    with pytest.raises(BundleVerificationError) as refused:
        load_bundle(path)
    assert str(refused.value) == f"serving bundle {path} failed verification: {expected}"
    assert isinstance(refused.value, ArtifactIntegrityError)


def test_an_added_file_is_named(serving_bundle_artifact: BundledHome, copy_bundle) -> None:
    path = copy_bundle(serving_bundle_artifact.bundle)
    (path / "extra.bin").write_bytes(b"not part of the bundle")
    report = verify_bundle(path)
    assert (report["ok"], report["problems"]) == (False, [f"{path / 'extra.bin'}: not listed in the manifest"])
    with pytest.raises(BundleVerificationError, match="extra.bin: not listed in the manifest"):
        load_bundle(path)


def test_a_removed_file_is_named(serving_bundle_artifact: BundledHome, copy_bundle) -> None:
    path = copy_bundle(serving_bundle_artifact.bundle)
    (path / "tokenizer_config.json").unlink()
    expected = f"{path}: manifest lists 'tokenizer_config.json', which is missing; not read"
    assert verify_bundle(path)["problems"] == [expected]
    with pytest.raises(BundleVerificationError) as refused:
        load_bundle(path)
    assert str(refused.value).endswith(expected)


def test_a_bundle_file_dropped_from_the_manifest_too_is_named(
    serving_bundle_artifact: BundledHome, copy_bundle
) -> None:
    path = copy_bundle(serving_bundle_artifact.bundle)
    (path / GOLDEN_FILE).unlink()
    manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    del manifest["files"][GOLDEN_FILE]
    (path / MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")
    assert verify_bundle(path)["problems"] == [f"{path / GOLDEN_FILE}: a bundle file the manifest does not list"]


def test_a_rehashed_file_without_the_content_hash_is_caught(serving_bundle_artifact: BundledHome, copy_bundle) -> None:
    path = copy_bundle(serving_bundle_artifact.bundle)
    serving = json.loads((path / SERVING_FILE).read_text(encoding="utf-8"))
    (path / SERVING_FILE).write_text(json.dumps({**serving, "max_batch": 1}), encoding="utf-8")
    manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    manifest["files"][SERVING_FILE] = sha256_file(path / SERVING_FILE)
    (path / MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")
    assert verify_bundle(path)["problems"] == [f"{path / MANIFEST}: content_sha256 does not match the files' hashes"]


def test_a_changed_golden_is_caught_by_the_replay_naming_the_prompt(
    serving_bundle_artifact: BundledHome, copy_bundle
) -> None:
    path = copy_bundle(serving_bundle_artifact.bundle)
    doc = json.loads((path / GOLDEN_FILE).read_text(encoding="utf-8"))
    original = doc["outputs"][1]
    assert original["prompt"] == "数据清洗"
    altered = [original["token_ids"][0], original["token_ids"][1] + 1, *original["token_ids"][2:]]
    doc["outputs"][1] = {**original, "token_ids": altered}
    (path / GOLDEN_FILE).write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    rehash(path, GOLDEN_FILE)
    # Every file matches the manifest: what fails below is the replay, nothing else.
    assert file_problems(path, json.loads((path / MANIFEST).read_text(encoding="utf-8"))) == []

    expected = (
        f"{path / GOLDEN_FILE}: golden prompt '数据清洗' differs from token 1: expected {original['text']!r} "
        f"{altered}, got {original['text']!r} {original['token_ids']}"
    )
    report = verify_bundle(path)
    assert report["ok"] is False
    assert report["problems"] == [expected]
    assert [(g["prompt"], g["conversation"], g["ok"]) for g in report["goldens"]] == [
        ("The data pipeline", False, True),
        ("数据清洗", False, False),
        ("A model", False, True),
        *[(g["prompt"], True, True) for g in doc["outputs"][3:]],
    ]
    with pytest.raises(BundleVerificationError) as refused:
        load_bundle(path)
    assert str(refused.value) == f"serving bundle {path} failed verification: {expected}"
    # Without the replay the same bundle loads: the goldens were the only difference.
    assert load_bundle(path, check_goldens=False).bundle_id == serving_bundle_artifact.bundle.id


def test_a_directory_that_is_not_a_bundle(serving_bundle_artifact: BundledHome, tmp_path: Path) -> None:
    model = serving_bundle_artifact.model
    assert verify_bundle(model.path)["problems"] == [
        f"{model.path / MANIFEST}: kind is 'model_checkpoint', not 'serving_bundle'; not a serving bundle"
    ]
    report = verify_bundle(tmp_path / "nowhere")
    assert report["ok"] is False and report["bundle_id"] is None
    assert report["problems"] == [
        f"{tmp_path / 'nowhere' / MANIFEST}: missing; {tmp_path / 'nowhere'} is not a serving bundle"
    ]
    with pytest.raises(BundleVerificationError, match="not a serving bundle"):
        load_bundle(tmp_path / "nowhere")


@pytest.mark.parametrize(
    "name, content, expected",
    [
        (SERVING_FILE, {"max_batch": 16}, "needs integer max_batch, max_context, max_prefill_tokens, eos_token_id"),
        (GOLDEN_FILE, {"threads": 1, "outputs": [{"prompt": "x"}]}, "not a golden file"),
        (GOLDEN_FILE, [], "not a golden file"),
        (SERVING_FILE, "{not json", "unreadable: "),
    ],
    ids=["serving-fields", "golden-entry", "golden-shape", "serving-json"],
)
def test_malformed_json_under_a_rehashed_manifest_is_named(
    serving_bundle_artifact: BundledHome, copy_bundle, name: str, content, expected: str
) -> None:
    path = copy_bundle(serving_bundle_artifact.bundle)
    (path / name).write_text(content if isinstance(content, str) else json.dumps(content), encoding="utf-8")
    rehash(path, name)
    [problem] = verify_bundle(path)["problems"]
    assert problem.startswith(f"{path / name}: {expected}")
    with pytest.raises(BundleVerificationError) as refused:
        load_bundle(path)
    assert str(refused.value) == problem


def test_a_golden_the_engine_refuses_is_named(serving_bundle_artifact: BundledHome, copy_bundle) -> None:
    path = copy_bundle(serving_bundle_artifact.bundle)
    doc = json.loads((path / GOLDEN_FILE).read_text(encoding="utf-8"))
    doc["outputs"][0]["max_new_tokens"] = 1000  # beyond max_context: the engine never recorded this
    (path / GOLDEN_FILE).write_text(json.dumps(doc), encoding="utf-8")
    rehash(path, GOLDEN_FILE)
    [problem] = verify_bundle(path)["problems"]
    assert problem.startswith(f"{path / GOLDEN_FILE}: the engine refuses a golden: max_new_tokens: ")


def test_a_bundle_from_before_the_recipe_split_still_loads(serving_bundle_artifact: BundledHome, copy_bundle) -> None:
    """serving_bundle-v3 wrote the server's settings into serving.json too (max_waiting,
    timeouts, threads, device): such a bundle is still what a rollback may need, so it loads,
    and what it says of the server's settings is not read."""
    path = copy_bundle(serving_bundle_artifact.bundle)
    serving = json.loads((path / SERVING_FILE).read_text(encoding="utf-8"))
    older = {**serving, "max_waiting": 2, "request_timeout_s": 0.001, "drain_timeout_s": 0.0, "threads": 99}
    (path / SERVING_FILE).write_text(json.dumps(older), encoding="utf-8")
    rehash(path, SERVING_FILE)
    assert verify_bundle(path)["ok"] is True
    loaded = load_bundle(path)
    assert loaded.make_engine(max_waiting=32).limits.max_waiting == 32


@pytest.mark.parametrize("change", ["changed", "removed"])
def test_a_chat_template_that_no_longer_renders_the_golden_conversations_is_caught(
    serving_bundle_artifact: BundledHome, copy_bundle, change: str
) -> None:
    path = copy_bundle(serving_bundle_artifact.bundle)
    config_path = path / "tokenizer_config.json"
    tokenizer_config = json.loads(config_path.read_text(encoding="utf-8"))
    if change == "changed":
        tokenizer_config["chat_template"] = tokenizer_config["chat_template"].replace("### ", "## ")
    else:
        del tokenizer_config["chat_template"]
    config_path.write_text(json.dumps(tokenizer_config), encoding="utf-8")
    rehash(path, "tokenizer_config.json")
    golden = json.loads((path / GOLDEN_FILE).read_text(encoding="utf-8"))["outputs"]
    conversations = [g for g in golden if "messages" in g]
    assert len(conversations) == 2
    report = verify_bundle(path)
    assert report["problems"] == [
        f"{path / GOLDEN_FILE}: golden conversation {g['prompt']!r}: its messages no longer render to the recorded "
        "prompt through the bundle's chat template (tokenizer_config.json chat_template missing, changed, or "
        "rendered differently)"
        for g in conversations
    ]
    assert [g["ok"] for g in report["goldens"]] == ["messages" not in g for g in golden]
    with pytest.raises(BundleVerificationError, match="golden conversation"):
        load_bundle(path)

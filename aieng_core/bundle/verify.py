"""Loading a serving bundle only after proving it is the bundle that was built.

Three layers, each naming what differs: every file is re-hashed against manifest.json
(nothing missing, nothing unlisted, nothing changed, and the content hash agrees with the
file hashes); the model loads from safetensors only; the golden prompts are replayed through
the serving engine and must give the recorded token ids. `load_bundle` stops at the first
problem (the server refuses the bundle); `verify_bundle` reports them all (the CLI and the
Dagster check).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aieng_core.bundle.golden import GOLDEN_DEVICE, replay_goldens
from aieng_core.bundle.serving_bundle import (
    BUNDLE_FILES,
    ENGINE_LIMIT_FIELDS,
    GOLDEN_FILE,
    KIND,
    REQUEST_DEFAULT_FIELDS,
    SERVING_FILE,
    bundle_content_sha256,
    engine_for,
)
from aieng_core.serving.chat_template import NO_CHAT_TEMPLATE, ChatTemplate
from aieng_core.store import Artifact, ArtifactIntegrityError, ArtifactStore
from aieng_core.store.artifacts import MANIFEST

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from aieng_core.config.serving_sections import ServingConfig
    from aieng_core.model.llama import LlamaForCausalLM
    from aieng_core.serving.engine import Engine


class BundleVerificationError(ArtifactIntegrityError):
    """A serving bundle does not match its manifest or its golden outputs."""


@dataclass
class LoadedBundle:
    bundle_id: str
    path: Path
    manifest: dict[str, Any]
    serving: dict[str, Any]  # serving.json
    golden: list[dict[str, Any]]  # golden.json's outputs
    model: LlamaForCausalLM
    tokenizer: Tokenizer
    eos_token_id: int
    chat_template: ChatTemplate = NO_CHAT_TEMPLATE  # tokenizer_config.json's; source None: no chat

    def make_engine(
        self, max_waiting: int, serving: ServingConfig | None = None, thread_counts: tuple[int, ...] = ()
    ) -> Engine:
        """The bundle's engine with a queue of `max_waiting` (the server's serving.max_waiting);
        with the server's `serving` config, its decode steps are captured at warmup as that
        config says (serving.step_graphs), at each of `thread_counts` (default: the config's for
        the cores this process has), cached in the store holding the bundle, and its prefix
        cache is serving.prefix_cache_tokens, keyed by the bundle's id."""
        graphs, prefix_cache_tokens = None, 0
        if serving is not None:
            prefix_cache_tokens = serving.prefix_cache_tokens
            from aieng_core.cpu.quota import read_cpu_quota
            from aieng_core.serving.step_graphs import StepGraphSettings
            from aieng_core.store.lineage import bundle_store

            store = bundle_store(self.path)
            graphs = StepGraphSettings(
                mode=serving.step_graphs,
                max_seconds=serving.warmup_max_seconds,
                cache_dir=store.home / "cache" / "step-graphs" if store is not None else None,
                thread_counts=thread_counts or serving.thread_counts(read_cpu_quota().cores),
            )
        return engine_for(
            self.model, self.tokenizer, self.serving, max_waiting, graphs, self.bundle_id, prefix_cache_tokens
        )


def read_manifest(path: Path) -> dict[str, Any]:
    manifest_path = path / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BundleVerificationError(f"{manifest_path}: missing; {path} is not a serving bundle") from None
    except (OSError, ValueError) as exc:
        raise BundleVerificationError(f"{manifest_path}: unreadable manifest: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("kind") != KIND:
        kind = manifest.get("kind") if isinstance(manifest, dict) else None
        raise BundleVerificationError(f"{manifest_path}: kind is {kind!r}, not {KIND!r}; not a serving bundle")
    return manifest


def bundle_artifact(path: Path, manifest: dict[str, Any]) -> Artifact:
    return Artifact(kind=KIND, id=str(manifest.get("id")), path=path, manifest=manifest)


def file_problems(path: Path, manifest: dict[str, Any]) -> list[str]:
    """Every way the directory differs from its manifest, each naming the file."""
    artifact = bundle_artifact(path, manifest)
    # verify() reads only the artifact's own directory; the store's home plays no part.
    problems = ArtifactStore(path).verify(artifact)
    listed = manifest.get("files", {})
    if isinstance(listed, dict):
        problems += [
            f"{path / name}: a bundle file the manifest does not list" for name in BUNDLE_FILES if name not in listed
        ]
        if not problems:
            content = bundle_content_sha256({name: listed[name] for name in BUNDLE_FILES})
            if content != manifest.get("content_sha256"):
                problems.append(f"{path / MANIFEST}: content_sha256 does not match the files' hashes")
    return problems


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BundleVerificationError(f"{path}: unreadable: {exc}") from None


def _load_model(artifact: Artifact, device: str) -> LlamaForCausalLM:
    from aieng_core.model.hf_files import load_model

    return load_model(artifact, device)


def _replay(
    artifact: Artifact, golden_doc: dict[str, Any], serving: dict[str, Any], model: Any, chat: ChatTemplate
) -> list[dict]:
    """Replay the goldens on CPU with the recorded thread count; `model` is reused when it is
    already a CPU model of this bundle, else a CPU copy is loaded for the replay."""
    from aieng_core.serving.device import torch_threads
    from aieng_core.serving.request import RequestError
    from aieng_core.tokenizer.bpe import load_tokenizer

    outputs = golden_doc["outputs"]
    # The limits the goldens were recorded with: the bundle's, every golden waiting at once.
    with torch_threads(int(golden_doc["threads"])):
        cpu_model = model if model is not None else _load_model(artifact, GOLDEN_DEVICE)
        engine = engine_for(cpu_model, load_tokenizer(artifact.path), serving, max_waiting=len(outputs))
        try:
            return replay_goldens(engine, outputs, chat)
        except RequestError as exc:  # a golden the engine refuses cannot have been recorded by it
            raise BundleVerificationError(
                f"{artifact.path / GOLDEN_FILE}: the engine refuses a golden: {exc}"
            ) from None


def _chat_template(path: Path) -> ChatTemplate:
    try:
        return ChatTemplate.of_directory(path)
    except ValueError as exc:
        raise BundleVerificationError(str(exc)) from None


def golden_problem(path: Path, result: dict[str, Any]) -> str:
    where = (
        f"{path / GOLDEN_FILE}: golden {'conversation' if result['conversation'] else 'prompt'} {result['prompt']!r}"
    )
    if not result["rendered_match"]:
        return (
            f"{where}: its messages no longer render to the recorded prompt through the bundle's chat template "
            "(tokenizer_config.json chat_template missing, changed, or rendered differently)"
        )
    if not result["prompt_ids_match"]:
        return f"{where} no longer encodes to the recorded prompt_ids"
    expected, got = result["expected_token_ids"], result["got_token_ids"]
    first = next((i for i, (a, b) in enumerate(zip(expected, got)) if a != b), min(len(expected), len(got)))
    return (
        f"{where} differs from token {first}: expected {result['expected_text']!r} {expected}, "
        f"got {result['got_text']!r} {got}"
    )


# What each JSON file must hold before anything is built from it: a manifest re-hashed by
# hand can vouch for any bytes, and a KeyError is no way to say which file is wrong.
GOLDEN_ENTRY = {"prompt": str, "prompt_ids": list, "max_new_tokens": int, "token_ids": list, "text": str}


def _serving_json(path: Path) -> dict[str, Any]:
    serving = _read_json(path / SERVING_FILE)
    integers = (*ENGINE_LIMIT_FIELDS, "eos_token_id", "default_max_new_tokens", "default_top_k")
    numbers = ("default_temperature", "default_top_p")
    if (
        not isinstance(serving, dict)
        or any(type(serving.get(name)) is not int for name in integers)
        or any(type(serving.get(name)) not in (int, float) for name in numbers)
    ):
        raise BundleVerificationError(
            f"{path / SERVING_FILE}: needs integer {', '.join(integers)} and numbers {', '.join(numbers)} "
            f"(the engine limits and request defaults: {', '.join((*ENGINE_LIMIT_FIELDS, *REQUEST_DEFAULT_FIELDS))})"
        )
    return serving


def _is_conversation(messages: Any) -> bool:
    return (
        isinstance(messages, list)
        and bool(messages)
        and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages
        )
    )


def _golden_doc(path: Path) -> dict[str, Any]:
    doc = _read_json(path / GOLDEN_FILE)
    outputs = doc.get("outputs") if isinstance(doc, dict) else None
    if (
        not isinstance(outputs, list)
        or type(doc.get("threads")) is not int
        or doc["threads"] < 1
        or not all(
            isinstance(entry, dict)
            and all(type(entry.get(key)) is kind for key, kind in GOLDEN_ENTRY.items())
            and ("messages" not in entry or _is_conversation(entry["messages"]))
            for entry in outputs
        )
    ):
        raise BundleVerificationError(
            f"{path / GOLDEN_FILE}: not a golden file (needs 'threads' and 'outputs' of {', '.join(GOLDEN_ENTRY)}; "
            "a conversation's 'messages' a list of {role, content} strings)"
        )
    return doc


def load_bundle(path: str | Path, device: str = "cpu", check_goldens: bool = True) -> LoadedBundle:
    """The bundle at `path`, verified: raises BundleVerificationError naming the first file
    or golden prompt that differs."""
    from aieng_core.model.hf_files import checkpoint_config
    from aieng_core.tokenizer.bpe import load_tokenizer

    path = Path(path).resolve()
    manifest = read_manifest(path)
    problems = file_problems(path, manifest)
    if problems:
        raise BundleVerificationError(f"serving bundle {path} failed verification: {problems[0]}")
    artifact = bundle_artifact(path, manifest)
    serving = _serving_json(path)
    golden_doc = _golden_doc(path)
    chat = _chat_template(path)  # read once: the replay renders through it, and so does the server
    model = _load_model(artifact, device)
    if check_goldens:
        replay_model = model if str(device) == GOLDEN_DEVICE else None
        for result in _replay(artifact, golden_doc, serving, replay_model, chat):
            if not result["ok"]:
                raise BundleVerificationError(
                    f"serving bundle {path} failed verification: {golden_problem(path, result)}"
                )
    from aieng_core.model.hf_files import stored_weights

    said, stored = serving.get("weights", "fp32"), stored_weights(path)
    if said != stored:
        raise BundleVerificationError(
            f"{path / SERVING_FILE}: weights {said!r}, but model.safetensors holds {stored!r}"
        )
    eos = int(serving["eos_token_id"])
    if checkpoint_config(artifact).eos_token_id != eos:
        raise BundleVerificationError(f"{path / SERVING_FILE}: eos_token_id {eos} is not the model's")
    return LoadedBundle(
        bundle_id=str(manifest["id"]),
        path=path,
        manifest=manifest,
        serving=serving,
        golden=golden_doc["outputs"],
        model=model,
        tokenizer=load_tokenizer(path),
        eos_token_id=eos,
        chat_template=chat,
    )


def verify_bundle(path: str | Path) -> dict[str, Any]:
    """Every problem with the bundle at `path`, as a report:
    {bundle_id, path, ok, problems, files_checked, goldens: [{prompt, ok, expected_text, got_text}]}."""
    path = Path(path).resolve()
    report: dict[str, Any] = {
        "bundle_id": None,
        "path": str(path),
        "ok": False,
        "problems": [],
        "files_checked": 0,
        "goldens": [],
    }
    try:
        manifest = read_manifest(path)
    except BundleVerificationError as exc:
        report["problems"].append(str(exc))
        return report
    report["bundle_id"] = manifest.get("id")
    listed = manifest.get("files")
    report["files_checked"] = len(listed) if isinstance(listed, dict) else 0
    report["problems"] = file_problems(path, manifest)
    if report["problems"]:  # nothing is loaded from bytes that do not match the manifest
        return report
    try:
        serving = _serving_json(path)
        golden_doc = _golden_doc(path)
        results = _replay(bundle_artifact(path, manifest), golden_doc, serving, None, _chat_template(path))
    except ArtifactIntegrityError as exc:
        report["problems"].append(str(exc))
        return report
    report["goldens"] = [
        {key: result[key] for key in ("prompt", "conversation", "ok", "expected_text", "got_text")}
        for result in results
    ]
    report["problems"] += [golden_problem(path, result) for result in results if not result["ok"]]
    report["ok"] = not report["problems"]
    return report

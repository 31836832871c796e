"""Model files in Hugging Face layout: saving a model as a directory, and loading it back safely.

This is the model's own save/load; the model_checkpoint asset's builder, which trains and
publishes such a directory, is aieng_core/training/model_checkpoint.py.

The artifact directory is what `transformers.AutoModelForCausalLM.from_pretrained(dir)` and
`AutoTokenizer.from_pretrained(dir)` read. Loading is safetensors only, memory-mapped, after
every file's SHA-256 has been checked against the artifact manifest: a tampered or
truncated file is a clear error naming it, never a silently wrong model. No torch.load.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from aieng_core.hashing import sha256_file
from aieng_core.model.int8_weights import FP32, INT8, WEIGHTS_METADATA_KEY, int8_model, int8_state_dict
from aieng_core.model.llama import LlamaConfig, LlamaForCausalLM
from aieng_core.model.weights import load_into, unique_state_dict
from aieng_core.store import Artifact, ArtifactIntegrityError
from aieng_core.store.artifacts import MANIFEST

MODEL_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
GENERATION_CONFIG_FILE = "generation_config.json"


def save_model_dir(model: LlamaForCausalLM, directory: Path) -> None:
    config = model.config
    save_file(
        {k: v.cpu() for k, v in unique_state_dict(model).items()}, directory / MODEL_FILE, metadata={"format": "pt"}
    )
    (directory / CONFIG_FILE).write_text(
        json.dumps(config.to_hf_dict(), indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )
    generation = {
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_id,
        "pad_token_id": config.pad_token_id,
        "do_sample": False,
    }
    (directory / GENERATION_CONFIG_FILE).write_text(
        json.dumps(generation, indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )


def verify_files(directory: Path, manifest: dict[str, Any], names: tuple[str, ...]) -> None:
    listed = manifest.get("files", {})
    for name in names:
        path = directory / name
        if name not in listed:
            raise ArtifactIntegrityError(f"{path}: not listed in {directory / MANIFEST}")
        if not path.is_file():
            raise ArtifactIntegrityError(f"{path}: missing")
        if sha256_file(path) != listed[name]:
            raise ArtifactIntegrityError(
                f"{path}: SHA-256 does not match the artifact manifest (tampered or truncated)"
            )


def load_model(artifact: Artifact, device: str | torch.device = "cpu") -> LlamaForCausalLM:
    """The model of a model_checkpoint artifact (or of a bundle), integrity-checked,
    memory-mapped; an int8 file (its metadata says so) is turned back into float32 weights
    (model/int8_weights.py)."""
    config = checkpoint_config(artifact)
    tensors = _stored_tensors(artifact, device)
    # Shapes only: the stored tensors become the parameters (memory-mapped, except q/k/v and
    # gate/up, which load_into stacks into new tensors).
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    if stored_weights(artifact.path) == INT8:
        try:
            return int8_model(model, tensors).to(device)
        except ValueError as exc:
            raise ArtifactIntegrityError(f"{artifact.path / MODEL_FILE}: {exc}") from None
    load_into(model, tensors, assign=True)
    return model.to(device).eval()


def stored_weights(directory: Path) -> str:
    """fp32 or int8: what a model.safetensors holds, as its metadata says (fp32 when unsaid)."""
    try:
        with safe_open(str(directory / MODEL_FILE), framework="pt") as handle:
            metadata = handle.metadata() or {}
    except SafetensorError as exc:
        raise ArtifactIntegrityError(f"{directory / MODEL_FILE}: unreadable safetensors: {exc}") from None
    weights = metadata.get(WEIGHTS_METADATA_KEY, FP32)
    if weights not in (FP32, INT8):
        raise ArtifactIntegrityError(f"{directory / MODEL_FILE}: unknown {WEIGHTS_METADATA_KEY} {weights!r}")
    return weights


def save_int8_weights(model: LlamaForCausalLM, directory: Path) -> None:
    """model.safetensors of the int8 variant of a float32 `model` (int8_weights.py)."""
    tensors = {name: tensor.cpu() for name, tensor in int8_state_dict(model).items()}
    # One metadata key only: safetensors writes the metadata map in hash order, so two keys come
    # out in either order and the same weights would give different bytes (and another id's
    # content). transformers cannot load this file anyway, so its "format" key buys nothing.
    save_file(tensors, directory / MODEL_FILE, metadata={WEIGHTS_METADATA_KEY: INT8})


def checkpoint_config(artifact: Artifact) -> LlamaConfig:
    verify_files(artifact.path, artifact.manifest, (CONFIG_FILE,))
    return LlamaConfig.from_hf_dict(json.loads((artifact.path / CONFIG_FILE).read_text(encoding="utf-8")))


def _stored_tensors(artifact: Artifact, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    verify_files(artifact.path, artifact.manifest, (MODEL_FILE,))
    try:
        return load_file(artifact.path / MODEL_FILE, device=str(device))
    except SafetensorError as exc:
        raise ArtifactIntegrityError(f"{artifact.path / MODEL_FILE}: unreadable safetensors: {exc}") from None


def non_finite_tensors(artifact: Artifact) -> list[str]:
    """Names of stored tensors holding a NaN or an inf."""
    return sorted(name for name, tensor in _stored_tensors(artifact).items() if not torch.isfinite(tensor).all())


def stored_parameters(artifact: Artifact) -> int:
    return sum(tensor.numel() for tensor in _stored_tensors(artifact).values())

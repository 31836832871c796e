"""int8 weights (model/int8_weights.py): the stored file, its load, and the engine on it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from aieng_core.hashing import sha256_file
from aieng_core.model.hf_files import MODEL_FILE, load_model, save_int8_weights, save_model_dir, stored_weights
from aieng_core.model.int8_weights import (
    SCALE_SUFFIX,
    WEIGHTS_METADATA_KEY,
    int8_state_dict,
    is_int8_model,
    quantize_rows,
    quantized_copy,
)
from aieng_core.model.llama import LlamaConfig, LlamaForCausalLM
from aieng_core.store import Artifact, ArtifactIntegrityError

CONFIG = LlamaConfig(
    vocab_size=97,
    hidden_size=32,
    intermediate_size=86,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    torch.manual_seed(3)
    return LlamaForCausalLM(CONFIG).eval()


def saved(model: LlamaForCausalLM, directory: Path, int8: bool) -> Artifact:
    save_model_dir(model, directory)
    if int8:
        save_int8_weights(model, directory)
    files = {name: sha256_file(directory / name) for name in (MODEL_FILE, "config.json")}
    return Artifact(kind="serving_bundle", id="test", path=directory, manifest={"files": files})


def test_rows_are_symmetric_per_channel_and_exact_at_the_row_maximum() -> None:
    weight = torch.tensor([[0.5, -1.0, 0.25], [0.0, 0.0, 0.0], [3.0, 1.5, -0.75]])
    values, scale = quantize_rows(weight)
    assert values.dtype == torch.int8 and scale.dtype == torch.float32
    assert scale.tolist() == pytest.approx([1.0 / 127, 1.0, 3.0 / 127])
    assert values.abs().amax(dim=1).tolist() == [127, 0, 127]  # each row's largest value maps to +-127
    assert values[0].tolist() == [64, -127, 32]
    assert ((values.float() * scale[:, None]) - weight).abs().max() <= scale.max() / 2


def test_the_file_is_int8_in_transformers_names_with_a_scale_each(model: LlamaForCausalLM, tmp_path: Path) -> None:
    artifact = saved(model, tmp_path, int8=True)
    tensors = load_file(tmp_path / MODEL_FILE)
    with safe_open(str(tmp_path / MODEL_FILE), framework="pt") as handle:
        assert handle.metadata()[WEIGHTS_METADATA_KEY] == "int8"
    linear = sorted(name for name in tensors if name.endswith("_proj.weight") or name == "lm_head.weight")
    # 7 linear weights per layer (q, k, v, o, gate, up, down) plus the tied lm_head's own copy.
    assert len(linear) == 7 * CONFIG.num_hidden_layers + 1
    for name in linear:
        assert tensors[name].dtype == torch.int8, name
        assert tensors[name + SCALE_SUFFIX].shape == (tensors[name].shape[0],), name
    assert tensors["model.embed_tokens.weight"].dtype == torch.float32
    assert stored_weights(tmp_path) == "int8"
    assert is_int8_model(load_model(artifact))


def test_the_same_weights_give_the_same_bytes(model: LlamaForCausalLM, tmp_path: Path) -> None:
    # safetensors writes its metadata map in hash order: more than one key would vary the bytes.
    files = []
    for attempt in range(8):
        directory = tmp_path / str(attempt)
        directory.mkdir()
        save_int8_weights(model, directory)
        files.append((directory / MODEL_FILE).read_bytes())
    assert all(data == files[0] for data in files)


def test_a_loaded_int8_model_computes_what_the_in_memory_one_does(model: LlamaForCausalLM, tmp_path: Path) -> None:
    loaded = load_model(saved(model, tmp_path, int8=True))
    in_memory = quantized_copy(model)
    ids = torch.randint(0, CONFIG.vocab_size, (3, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        a, b, reference = loaded(ids)[0], in_memory(ids)[0], model(ids)[0]
    assert torch.equal(a, b)
    # Close to float32, not equal: int8 weights and activations cost a little.
    error = (a - reference).abs().max() / reference.abs().max()
    assert 0 < error < 0.05


def test_a_float32_file_still_loads_as_float32(model: LlamaForCausalLM, tmp_path: Path) -> None:
    loaded = load_model(saved(model, tmp_path, int8=False))
    assert stored_weights(tmp_path) == "fp32"
    assert not is_int8_model(loaded)


def test_an_int8_weight_without_its_scale_is_refused(model: LlamaForCausalLM, tmp_path: Path) -> None:
    saved(model, tmp_path, int8=True)
    tensors = int8_state_dict(model)
    del tensors["model.layers.0.mlp.down_proj.weight" + SCALE_SUFFIX]
    save_file(tensors, tmp_path / MODEL_FILE, metadata={WEIGHTS_METADATA_KEY: "int8"})
    files = {name: sha256_file(tmp_path / name) for name in (MODEL_FILE, "config.json")}
    with pytest.raises(ArtifactIntegrityError, match=r"model.safetensors: int8 weights: .*down_proj.weight has no "):
        load_model(Artifact(kind="x", id="x", path=tmp_path, manifest={"files": files}))


def test_an_unknown_weights_kind_is_refused(model: LlamaForCausalLM, tmp_path: Path) -> None:
    saved(model, tmp_path, int8=False)
    save_file(load_file(tmp_path / MODEL_FILE), tmp_path / MODEL_FILE, metadata={WEIGHTS_METADATA_KEY: "int4"})
    with pytest.raises(Exception, match="unknown aieng_weights 'int4'"):
        stored_weights(tmp_path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda t: t.update({"model.norm.weight_scale": torch.ones(1)}), r"model.norm.weight_scale scales no int8"),
        (
            lambda t: t.update({"lm_head.weight_scale": torch.ones(3)}),
            r"lm_head.weight_scale is torch.float32 of shape \(3,\), not one float32 scale per row of lm_head",
        ),
        (
            lambda t: t["model.layers.1.self_attn.o_proj.weight_scale"].__setitem__(0, float("nan")),
            r"o_proj.weight_scale holds a scale that is not finite and above 0",
        ),
        (
            lambda t: t.update({"model.layers.0.mlp.up_proj.weight": torch.zeros(86, 32)}),
            r"up_proj.weight is a 2-d torch.float32 tensor, not 2-d int8",
        ),
    ],
)
def test_scales_that_fit_no_weight_are_refused(model: LlamaForCausalLM, tmp_path: Path, change, message) -> None:
    saved(model, tmp_path, int8=True)
    tensors = int8_state_dict(model)
    change(tensors)
    save_file(tensors, tmp_path / MODEL_FILE, metadata={WEIGHTS_METADATA_KEY: "int8"})
    files = {name: sha256_file(tmp_path / name) for name in (MODEL_FILE, "config.json")}
    with pytest.raises(ArtifactIntegrityError, match=message):
        load_model(Artifact(kind="x", id="x", path=tmp_path, manifest={"files": files}))


def test_an_untied_model_round_trips_too(tmp_path: Path) -> None:
    torch.manual_seed(4)
    untied = LlamaForCausalLM(replace(CONFIG, tie_word_embeddings=False)).eval()
    loaded = load_model(saved(untied, tmp_path, int8=True))
    ids = torch.randint(0, CONFIG.vocab_size, (2, 20), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert torch.equal(loaded(ids)[0], quantized_copy(untied)(ids)[0])
    tensors = load_file(tmp_path / MODEL_FILE)
    assert tensors["lm_head.weight"].dtype == torch.int8
    # Its own lm_head, quantized from the untied matrix (not from the embeddings).
    values, _ = quantize_rows(untied.lm_head.weight)
    assert torch.equal(tensors["lm_head.weight"], values)


def test_an_int8_model_is_not_quantized_again(model: LlamaForCausalLM) -> None:
    with pytest.raises(ValueError, match="an int8 variant's already"):
        quantized_copy(quantized_copy(model))

"""The plain-PyTorch Llama against transformers' LlamaForCausalLM, in both directions.

Our files must load in transformers unchanged, theirs must load in ours, and on the same
weights both must compute the same logits and the same greedy continuations. Weights are
random but deliberately far from the init (non-unit norm gains, wide matrices), so a wrong
name, transpose, rotary layout or head grouping shows up as a large logit difference.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import load_file

from aieng_core.model.hf_files import CONFIG_FILE, GENERATION_CONFIG_FILE, MODEL_FILE, save_model_dir
from aieng_core.model.llama import LlamaConfig, LlamaForCausalLM, cross_entropy, expected_parameters
from aieng_core.model.memory import memory_budget
from aieng_core.model.weights import load_into, unique_state_dict

VOCAB = 97
LOGIT_TOLERANCE = 1e-4

# name -> (config, exact parameter count worked out by hand)
# h=32, intermediate=80, 2 layers, 4 heads of 8: q,o = 32*32; k,v = 32*(kv_heads*8) each;
# mlp = 3*32*80; two norms of 32 per layer; final norm 32; embedding 97*32 (x2 if untied).
CONFIGS = {
    "gqa-tied": (dict(num_key_value_heads=2, tie_word_embeddings=True), 3104 + 2 * (2048 + 1024 + 7680 + 64) + 32),
    "gqa-untied": (
        dict(num_key_value_heads=2, tie_word_embeddings=False),
        2 * 3104 + 2 * (2048 + 1024 + 7680 + 64) + 32,
    ),
    "mha-tied": (dict(num_key_value_heads=4, tie_word_embeddings=True), 3104 + 2 * (2048 + 2048 + 7680 + 64) + 32),
    "mqa-tied": (dict(num_key_value_heads=1, tie_word_embeddings=True), 3104 + 2 * (2048 + 512 + 7680 + 64) + 32),
    "mha-untied": (
        dict(num_key_value_heads=4, tie_word_embeddings=False),
        2 * 3104 + 2 * (2048 + 2048 + 7680 + 64) + 32,
    ),
}


def small_config(**overrides) -> LlamaConfig:
    base = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=80,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=1,
    )
    return LlamaConfig(**{**base, **overrides})


def randomize_(module: torch.nn.Module, seed: int) -> None:
    """Weights far from the init: matrices N(0, 0.3), norm gains 1 + N(0, 0.2)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(module.named_parameters()):
            noise = torch.randn(param.shape, generator=generator)
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.2 * noise)
            else:
                param.copy_(0.3 * noise)


def prompts(seed: int, batch: int = 2, length: int = 9) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(2, VOCAB, (batch, length), generator=generator)


def ours_with_random_weights(config: LlamaConfig, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    randomize_(model, seed)
    return model.eval()


def hf_greedy(model, input_ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
    return model.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        max_new_tokens=new_tokens,
        do_sample=False,
        eos_token_id=None,  # never stop early: compare every token
        pad_token_id=1,
    )


@pytest.fixture(params=sorted(CONFIGS))
def variant(request: pytest.FixtureRequest) -> tuple[str, LlamaConfig, int]:
    overrides, count = CONFIGS[request.param]
    return request.param, small_config(**overrides), count


# ---- ours -> transformers -------------------------------------------------------------------


def test_our_files_load_in_transformers_unchanged_with_equal_logits(variant, tmp_path: Path) -> None:
    name, config, _ = variant
    ours = ours_with_random_weights(config)
    save_model_dir(ours, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([MODEL_FILE, CONFIG_FILE, GENERATION_CONFIG_FILE])

    hf, info = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert type(hf) is transformers.LlamaForCausalLM
    assert not info["missing_keys"], info
    assert not info["unexpected_keys"], info
    assert not info["mismatched_keys"], info
    assert hf.config.num_key_value_heads == config.num_key_value_heads
    assert hf.config.num_attention_heads == config.num_attention_heads
    assert hf.config.tie_word_embeddings is config.tie_word_embeddings
    assert hf.config.head_dim == config.head_dim
    if not config.tie_word_embeddings:
        # Untied: transformers must really have read our lm_head, not tied it to the embedding.
        assert not torch.equal(hf.lm_head.weight, hf.model.embed_tokens.weight)
    hf.eval()

    ids = prompts(1)
    with torch.no_grad():
        ours_logits, _ = ours(ids)
        theirs = hf(ids).logits
    assert theirs.shape == ours_logits.shape == (2, 9, VOCAB)
    difference = (theirs - ours_logits).abs().max().item()
    assert difference <= LOGIT_TOLERANCE, f"{name}: max logit difference {difference}"
    # The test has teeth: the logits are far from trivially equal (not all ~0).
    assert ours_logits.std().item() > 0.5


def test_greedy_continuations_match_transformers_generate(variant, tmp_path: Path) -> None:
    name, config, _ = variant
    ours = ours_with_random_weights(config, seed=3)
    save_model_dir(ours, tmp_path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    ids = prompts(4)
    new_tokens = 20
    mine = ours.generate_greedy(ids, new_tokens)
    theirs = hf_greedy(hf, ids, new_tokens)
    assert mine.shape == (2, 9 + new_tokens)
    assert torch.equal(mine[:, :9], ids)
    assert mine.tolist() == theirs.tolist(), name
    # A degenerate continuation (one token repeated) would prove little.
    assert len(set(mine[0, 9:].tolist())) > 1


def test_generation_config_is_greedy_with_our_special_tokens(tmp_path: Path) -> None:
    config = small_config(bos_token_id=5, eos_token_id=6, pad_token_id=7)
    save_model_dir(LlamaForCausalLM(config), tmp_path)
    generation = json.loads((tmp_path / GENERATION_CONFIG_FILE).read_text())
    assert generation == {"bos_token_id": 5, "eos_token_id": 6, "pad_token_id": 7, "do_sample": False}
    loaded = transformers.GenerationConfig.from_pretrained(tmp_path)
    assert (loaded.bos_token_id, loaded.eos_token_id, loaded.pad_token_id, loaded.do_sample) == (5, 6, 7, False)


# ---- transformers -> ours -------------------------------------------------------------------


@pytest.mark.parametrize("kv_heads", [2, 4])
@pytest.mark.parametrize("tied", [True, False])
def test_transformers_weights_load_into_ours_with_equal_logits(tmp_path: Path, kv_heads: int, tied: bool) -> None:
    hf_config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=80,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        max_position_embeddings=64,
        rms_norm_eps=1e-6,  # not our default: must come from config.json
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},  # likewise
        tie_word_embeddings=tied,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=1,
    )
    torch.manual_seed(11)
    hf = transformers.LlamaForCausalLM(hf_config)
    randomize_(hf, seed=12)
    hf.eval()
    hf.save_pretrained(tmp_path, safe_serialization=True)

    config = LlamaConfig.from_hf_dict(json.loads((tmp_path / "config.json").read_text()))
    assert config.rope_theta == 500000.0
    assert config.rms_norm_eps == 1e-6
    assert (config.num_key_value_heads, config.tie_word_embeddings) == (kv_heads, tied)
    ours = LlamaForCausalLM(config)
    load_into(ours, load_file(tmp_path / "model.safetensors"))
    ours.eval()

    ids = prompts(5)
    with torch.no_grad():
        difference = (hf(ids).logits - ours(ids)[0]).abs().max().item()
    assert difference <= LOGIT_TOLERANCE
    assert torch.equal(ours.generate_greedy(ids, 12), hf_greedy(hf, ids, 12))


def test_loss_equals_transformers_loss_on_shifted_labels() -> None:
    config = small_config()
    ours = ours_with_random_weights(config, seed=8)
    ids = prompts(9, length=12)
    targets = torch.cat([ids[:, 1:], torch.full((ids.shape[0], 1), -100)], dim=1)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config.to_hf_dict()))
    missing, unexpected = hf.load_state_dict(unique_state_dict(ours), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    hf.eval()
    with torch.no_grad():
        logits, loss = ours(ids, targets)
        reference = F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
        theirs = hf(ids, labels=ids).loss
    assert loss.item() == pytest.approx(reference.item(), rel=1e-6)
    assert loss.item() == pytest.approx(theirs.item(), abs=1e-5)


# ---- counts and names -----------------------------------------------------------------------


def test_parameter_counts_agree_three_ways(variant) -> None:
    _, config, by_hand = variant
    ours = LlamaForCausalLM(config)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config.to_hf_dict()))
    assert expected_parameters(config) == by_hand
    assert ours.num_parameters() == by_hand
    assert hf.num_parameters() == by_hand


def test_state_dict_names_are_transformers_names(variant) -> None:
    _, config, by_hand = variant
    ours = unique_state_dict(LlamaForCausalLM(config))
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config.to_hf_dict()))
    theirs = {name: tuple(t.shape) for name, t in hf.state_dict().items()}
    if config.tie_word_embeddings:
        theirs.pop("lm_head.weight")
        assert "lm_head.weight" not in ours
    assert {name: tuple(t.shape) for name, t in ours.items()} == theirs
    assert sum(t.numel() for t in ours.values()) == by_hand


def test_tied_head_shares_the_embedding_storage() -> None:
    model = LlamaForCausalLM(small_config(tie_word_embeddings=True))
    assert model.lm_head.weight is model.model.embed_tokens.weight
    untied = LlamaForCausalLM(small_config(tie_word_embeddings=False))
    assert untied.lm_head.weight is not untied.model.embed_tokens.weight


def test_load_into_rejects_missing_and_unexpected_names() -> None:
    model = LlamaForCausalLM(small_config())
    tensors = unique_state_dict(model)
    missing = dict(tensors)
    del missing["model.norm.weight"]
    with pytest.raises(ValueError, match=r"missing \['model.norm.weight'\]"):
        load_into(model, missing)
    extra = {**tensors, "model.layers.9.mlp.up_proj.weight": torch.zeros(80, 32)}
    with pytest.raises(ValueError, match=r"unexpected \['model.layers.9.mlp.up_proj.weight'\]"):
        load_into(model, extra)


def test_load_into_copies_every_tensor() -> None:
    source = ours_with_random_weights(small_config(tie_word_embeddings=False), seed=21)
    target = LlamaForCausalLM(small_config(tie_word_embeddings=False))
    load_into(target, unique_state_dict(source))
    for name, tensor in unique_state_dict(source).items():
        assert torch.equal(unique_state_dict(target)[name], tensor), name


# ---- behaviour of the model itself ----------------------------------------------------------


def test_attention_is_causal() -> None:
    model = ours_with_random_weights(small_config(), seed=2)
    ids = prompts(6, batch=1, length=10)
    changed = ids.clone()
    changed[0, 7] = (changed[0, 7] + 1) % VOCAB
    with torch.no_grad():
        before, _ = model(ids)
        after, _ = model(changed)
    assert torch.equal(before[:, :7], after[:, :7])
    assert not torch.allclose(before[:, 7:], after[:, 7:])


def test_sequence_longer_than_max_positions_is_refused() -> None:
    model = LlamaForCausalLM(small_config(max_position_embeddings=16))
    model(torch.zeros(1, 16, dtype=torch.long))
    with pytest.raises(ValueError, match="17 tokens exceeds max_position_embeddings 16"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_greedy_generation_slides_past_max_positions() -> None:
    model = ours_with_random_weights(small_config(max_position_embeddings=16), seed=4)
    out = model.generate_greedy(prompts(7, batch=1, length=12), 10)
    assert out.shape == (1, 22)
    # Each new token is the argmax over the last 16 tokens before it.
    with torch.no_grad():
        logits, _ = model(out[:, 5:21])
    assert logits[0, -1].argmax().item() == out[0, 21].item()


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(hidden_size=30), "hidden_size 30 is not divisible by num_attention_heads 4"),
        (dict(num_key_value_heads=3), "num_attention_heads 4 is not divisible by num_key_value_heads 3"),
        (dict(hidden_size=36, num_attention_heads=4, num_key_value_heads=2), "head dimension must be even"),
    ],
)
def test_config_rejects_impossible_shapes(overrides: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        small_config(**overrides)


def test_hf_config_dict_round_trips() -> None:
    config = small_config(rope_theta=123.0, rms_norm_eps=1e-6, tie_word_embeddings=False, num_key_value_heads=1)
    data = config.to_hf_dict()
    assert data["architectures"] == ["LlamaForCausalLM"] and data["model_type"] == "llama"
    assert data["rope_parameters"] == {"rope_type": "default", "rope_theta": 123.0}
    assert data["head_dim"] == 8
    assert LlamaConfig.from_hf_dict(data) == config
    without_top_level_theta = {k: v for k, v in data.items() if k != "rope_theta"}
    assert LlamaConfig.from_hf_dict(without_top_level_theta) == config


def test_memory_budget_exact_values() -> None:
    budget = memory_budget(1_000_000_000)
    assert budget == {
        "weights_bytes_fp32": 4_000_000_000,
        "weights_bytes_bf16": 2_000_000_000,
        "weights_bytes_int8": 1_000_000_000,
        "gpu_rule_gib_fp32": 6.8429,  # 4e9 * 1.3 / 2**30 + 2
        "gpu_rule_gib_bf16": 4.4214,
        "gpu_rule_gib_int8": 3.2107,
    }
    for name, size in {"fp32": 4, "bf16": 2, "int8": 1}.items():
        assert budget[f"gpu_rule_gib_{name}"] == pytest.approx(1e9 * size * 1.3 / 2**30 + 2, abs=5e-5)
    assert math.isclose(memory_budget(0)["gpu_rule_gib_fp32"], 2.0)


# ---- fused projections and the loss ---------------------------------------------------------


def test_fused_projections_are_stored_as_transformers_separate_matrices() -> None:
    config = small_config(num_key_value_heads=2)
    model = ours_with_random_weights(config, seed=13)
    stored = unique_state_dict(model)
    layer = model.model.layers[1]
    # Rows in order: q (4 heads x 8), k (2 x 8), v (2 x 8); gate (80), up (80).
    qkv, gate_up = layer.self_attn.qkv_proj.weight, layer.mlp.gate_up_proj.weight
    assert torch.equal(stored["model.layers.1.self_attn.q_proj.weight"], qkv[:32])
    assert torch.equal(stored["model.layers.1.self_attn.k_proj.weight"], qkv[32:48])
    assert torch.equal(stored["model.layers.1.self_attn.v_proj.weight"], qkv[48:])
    assert torch.equal(stored["model.layers.1.mlp.gate_proj.weight"], gate_up[:80])
    assert torch.equal(stored["model.layers.1.mlp.up_proj.weight"], gate_up[80:])
    # A snapshot, not views of the parameters: a later training step does not change it.
    with torch.no_grad():
        qkv.add_(1.0)
    assert torch.equal(stored["model.layers.1.self_attn.q_proj.weight"] + 1.0, qkv[:32])


def test_stored_weights_round_trip_through_load_into_exactly(tmp_path: Path) -> None:
    source = ours_with_random_weights(small_config(), seed=14)
    target = LlamaForCausalLM(small_config())
    load_into(target, load_file_after_saving(source, tmp_path))
    for (name, mine), (_, theirs) in zip(source.state_dict().items(), target.state_dict().items(), strict=True):
        assert torch.equal(mine, theirs), name
    assert target.lm_head.weight is target.model.embed_tokens.weight


def load_file_after_saving(model: LlamaForCausalLM, directory: Path) -> dict[str, torch.Tensor]:
    save_model_dir(model, directory)
    return load_file(directory / MODEL_FILE)


def test_loss_and_its_gradient_equal_torch_cross_entropy() -> None:
    generator = torch.Generator().manual_seed(15)
    logits = (3 * torch.randn(40, VOCAB, generator=generator)).requires_grad_()
    targets = torch.randint(0, VOCAB, (40,), generator=generator)
    targets[::7] = -100  # ignored positions count neither in the mean nor in the gradient
    reference = F.cross_entropy(logits, targets, ignore_index=-100)
    (expected,) = torch.autograd.grad(2.5 * reference, logits)
    loss = cross_entropy(logits, targets)
    (gradient,) = torch.autograd.grad(2.5 * loss, logits)
    assert loss.item() == pytest.approx(reference.item(), rel=1e-6)
    assert (gradient - expected).abs().max().item() < 1e-7
    assert gradient[::7].abs().max().item() == 0.0
    assert expected.abs().max().item() > 1e-3  # the gradient compared is not trivially zero


def test_second_backward_through_the_loss_is_refused() -> None:
    logits = torch.randn(4, VOCAB, requires_grad=True)
    loss = cross_entropy(logits, torch.tensor([1, 2, 3, 4]))
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_training_steps_are_deterministic_for_a_fixed_seed() -> None:
    def two_steps() -> dict[str, torch.Tensor]:
        torch.manual_seed(16)
        model = LlamaForCausalLM(small_config())
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for seed in (17, 18):
            ids = prompts(seed, batch=4, length=12)
            _, loss = model(ids[:, :-1], ids[:, 1:])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        return unique_state_dict(model)

    first, second = two_steps(), two_steps()
    assert all(torch.equal(first[name], second[name]) for name in first)

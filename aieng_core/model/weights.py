"""State dicts in transformers' layout: what goes into model.safetensors and back.

Our modules hold q/k/v and gate/up as one matrix each (one matmul instead of three or two);
transformers stores them separately. Saving splits them under transformers' names, loading
stacks them again, so files and training checkpoints only ever carry transformers' names.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from aieng_core.model.llama import LlamaConfig, LlamaForCausalLM


def fused_parts(config: LlamaConfig) -> dict[str, list[tuple[str, int]]]:
    """Each fused parameter (by name suffix) -> the transformers tensors it stacks: (suffix, rows), in row order."""
    q_rows = config.num_attention_heads * config.head_dim
    kv_rows = config.num_key_value_heads * config.head_dim
    return {
        "self_attn.qkv_proj.weight": [
            ("self_attn.q_proj.weight", q_rows),
            ("self_attn.k_proj.weight", kv_rows),
            ("self_attn.v_proj.weight", kv_rows),
        ],
        "mlp.gate_up_proj.weight": [
            ("mlp.gate_proj.weight", config.intermediate_size),
            ("mlp.up_proj.weight", config.intermediate_size),
        ],
    }


def _transformers_tensors(model: LlamaForCausalLM) -> Iterator[tuple[str, torch.Tensor]]:
    """(transformers name, tensor) for every stored tensor, fused ones split into row views."""
    fused = fused_parts(model.config)
    for name, tensor in model.state_dict().items():
        suffix = next((s for s in fused if name.endswith(s)), None)
        if suffix is None:
            yield name, tensor
            continue
        prefix = name[: -len(suffix)]
        pieces = tensor.split([rows for _, rows in fused[suffix]])
        for (part, _), piece in zip(fused[suffix], pieces, strict=True):
            yield prefix + part, piece


def unique_state_dict(model: LlamaForCausalLM) -> dict[str, torch.Tensor]:
    """The state dict as transformers writes it: q/k/v and gate/up separate, a tied lm_head
    not stored twice. Copies: split views would share storage, which safetensors refuses."""
    state = {name: tensor.detach().clone() for name, tensor in _transformers_tensors(model)}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    return state


def load_into(model: LlamaForCausalLM, tensors: dict[str, torch.Tensor], assign: bool = False) -> None:
    """Load weights named as transformers names them, refusing any missing or unexpected name.
    With assign=True the tensors themselves become the parameters (for a model built on the
    meta device: no wasted random init); the fused ones are new stacked tensors."""
    expected = {name for name, _ in _transformers_tensors(model)}
    if model.config.tie_word_embeddings:
        expected.discard("lm_head.weight")
    missing, unexpected = expected - set(tensors), set(tensors) - expected
    if missing or unexpected:
        raise ValueError(f"weights do not fit the model: missing {sorted(missing)}, unexpected {sorted(unexpected)}")
    fused = fused_parts(model.config)
    ours = dict(tensors)
    for name in model.state_dict():
        suffix = next((s for s in fused if name.endswith(s)), None)
        if suffix is not None:
            prefix = name[: -len(suffix)]
            ours[name] = torch.cat([ours.pop(prefix + part) for part, _ in fused[suffix]])
    model.load_state_dict(ours, strict=False, assign=assign)
    if model.config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight  # assign replaced the shared tensor

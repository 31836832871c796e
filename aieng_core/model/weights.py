"""State dicts in transformers' layout: what goes into model.safetensors and back."""

from __future__ import annotations

import torch

from aieng_core.model.llama import LlamaForCausalLM


def unique_state_dict(model: LlamaForCausalLM) -> dict[str, torch.Tensor]:
    """The state dict as transformers writes it: a tied lm_head is not stored twice."""
    state = {name: tensor.detach().contiguous() for name, tensor in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    return state


def load_into(model: LlamaForCausalLM, tensors: dict[str, torch.Tensor], assign: bool = False) -> None:
    """Load weights, refusing any missing or unexpected name. With assign=True the tensors
    themselves become the parameters (for a model built on the meta device: no copy, no
    wasted random init)."""
    expected = set(unique_state_dict(model))
    missing, unexpected = expected - set(tensors), set(tensors) - expected
    if missing or unexpected:
        raise ValueError(f"weights do not fit the model: missing {sorted(missing)}, unexpected {sorted(unexpected)}")
    model.load_state_dict(tensors, strict=False, assign=assign)
    if model.config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight  # assign replaced the shared tensor

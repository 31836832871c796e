"""The shape rules of the attention heads, shared by the YAML config and the model config.

Kept free of torch so that loading a config stays fast.
"""

from __future__ import annotations


def head_shape_problem(hidden_size: int, num_attention_heads: int, num_key_value_heads: int) -> str | None:
    """Why these sizes cannot make a Llama attention layer, or None if they can."""
    if hidden_size % num_attention_heads:
        return f"hidden_size {hidden_size} is not divisible by num_attention_heads {num_attention_heads}"
    if num_attention_heads % num_key_value_heads:
        return (
            f"num_attention_heads {num_attention_heads} is not divisible by num_key_value_heads {num_key_value_heads}"
        )
    if (hidden_size // num_attention_heads) % 2:
        return (
            "the head dimension must be even for rotary embeddings "
            f"(hidden_size / num_attention_heads = {hidden_size // num_attention_heads})"
        )
    return None

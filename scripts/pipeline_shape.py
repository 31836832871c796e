"""The pipeline model's shape (configs/pipeline.yaml) with random weights, and the demo
corpus's tokenizer: what the measurement scripts beside this file run the engine on."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SEED = 1234


def pipeline_model(threads: int) -> tuple[Any, Any, Any]:
    """(config, model, tokenizer): torch on `threads` threads, the model in eval mode."""
    import torch

    sys.path.insert(0, str(REPO))
    from aieng_core.config import load_config
    from aieng_core.data.demo_data import corpus
    from aieng_core.model.llama import LlamaConfig, LlamaForCausalLM
    from aieng_core.tokenizer.bpe import train_bpe

    torch.set_num_threads(threads)
    config = load_config(REPO / "configs" / "pipeline.yaml")
    tokenizer = train_bpe((doc.text for doc in corpus()), config.tokenizer)
    shape = config.model
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=tokenizer.get_vocab_size(),
            hidden_size=shape.hidden_size,
            intermediate_size=shape.intermediate_size,
            num_hidden_layers=shape.num_hidden_layers,
            num_attention_heads=shape.num_attention_heads,
            num_key_value_heads=shape.num_key_value_heads,
            max_position_embeddings=shape.max_position_embeddings,
        )
    ).eval()
    return config, model, tokenizer

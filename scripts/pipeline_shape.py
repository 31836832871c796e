"""What the measurement scripts beside this file share: the pipeline model's shape
(configs/pipeline.yaml) with random weights and the demo corpus's tokenizer, each side of a
comparison run in a fresh process of its own (the order alternated by the serving bench's
run_rounds), and the result written as JSON."""

from __future__ import annotations

import json
import subprocess
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


def in_fresh_process(script: str, *args: str) -> dict[str, Any]:
    """Run `script --worker ...` in a new Python process; the JSON line it prints last."""
    done = subprocess.run([sys.executable, script, *args], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def write_result(result: dict[str, Any], out: Path | None) -> None:
    text = json.dumps(result, indent=2)
    if out:
        out.write_text(text + "\n", encoding="utf-8")
    print(text)

"""Fixtures of the engine tests: the tiny trained model and its tokenizer, loaded once."""

from __future__ import annotations

import pytest
import torch

from aieng_core.model.hf_files import load_model
from aieng_core.model.llama import LlamaForCausalLM
from aieng_core.serving.engine import Engine, EngineLimits
from aieng_core.tokenizer.bpe import load_tokenizer


@pytest.fixture(scope="session")
def tiny_model(trained_home):
    torch.manual_seed(0)
    return load_model(trained_home.model)


@pytest.fixture(scope="session")
def tiny_tokenizer(trained_home):
    return load_tokenizer(trained_home.model.path)


@pytest.fixture
def make_engine(tiny_model, tiny_tokenizer):
    def make(
        max_batch: int = 16, max_context: int = 64, max_waiting: int = 64, max_prefill_tokens: int = 512
    ) -> Engine:
        limits = EngineLimits(max_batch, max_context, max_waiting, max_prefill_tokens)
        return Engine(tiny_model, tiny_tokenizer, limits, tiny_model.config.eos_token_id)

    return make


@pytest.fixture(scope="session")
def sensitive_model(tiny_model) -> LlamaForCausalLM:
    # Randomly initialised, of the tiny shape, with matrices 15x the usual init: attention then
    # decides the greedy tokens (at the usual init the residual stream is the last token's
    # embedding, and keys and values that are off do not show), so reused keys that are wrong would.
    torch.manual_seed(11)
    model = LlamaForCausalLM(tiny_model.config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.normal_(0.0, 0.3)
    return model

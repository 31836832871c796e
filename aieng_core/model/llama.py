"""A Llama-architecture decoder in plain PyTorch, in the spirit of nanoGPT's model.py.

Token embedding -> N x [RMSNorm -> grouped-query attention with rotary positions -> residual,
RMSNorm -> SwiGLU MLP -> residual] -> RMSNorm -> LM head (optionally tied to the embedding).

`forward` is the reference (training, evaluation, `generate_greedy`). `forward_cached` is the
same network reading and writing a preallocated key/value cache (aieng_core/serving/kv_cache.py):
a prefill writes each prompt's keys and values into its sequence's slot; a decode step runs
every running sequence's next token, each at its own position, in one batched forward.

Parameter and config names are those of transformers' LlamaForCausalLM, except that q/k/v
and gate/up are each one matrix here (fewer, larger matmuls: faster training on CPU).
weights.py splits them on save and stacks them on load, so the safetensors we write load
in transformers unchanged, and theirs load here.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from aieng_core.model.shape import head_shape_problem


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int = 256
    intermediate_size: int = 688
    num_hidden_layers: int = 4
    num_attention_heads: int = 8
    num_key_value_heads: int = 4
    max_position_embeddings: int = 512
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = True
    bos_token_id: int = 0
    eos_token_id: int = 0
    pad_token_id: int = 1

    def __post_init__(self) -> None:
        if problem := head_shape_problem(self.hidden_size, self.num_attention_heads, self.num_key_value_heads):
            raise ValueError(problem)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def to_hf_dict(self) -> dict:
        """config.json as transformers' LlamaConfig expects it."""
        return {
            **asdict(self),
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "mlp_bias": False,
            "initializer_range": 0.02,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "use_cache": True,
            "torch_dtype": "float32",
        }

    @classmethod
    def from_hf_dict(cls, data: dict) -> LlamaConfig:
        fields = {name: data[name] for name in cls.__dataclass_fields__ if name in data}
        if "rope_theta" not in data and "rope_parameters" in data:
            fields["rope_theta"] = data["rope_parameters"]["rope_theta"]
        return cls(**fields)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalize in fp32, as Llama does, then cast back.
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotary_tables(
    config: LlamaConfig, positions: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of shape (*positions.shape, head_dim), halves repeated as in Llama."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float, device=positions.device) / dim))
    freqs = positions.float()[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + _rotate_half(x) * sin


class LayerCache(NamedTuple):
    """One layer's view of the KV cache for a cached forward.

    keys, values: the layer's cache, (slots, kv_heads, positions, head_dim).
    slots: (batch,) the slot of each row. positions: (batch, seq) the position of each token;
    its keys and values are written there.
    decode_mask: None for a prefill, where each row is a prompt from position 0 (right-padded:
    a causal mask keeps real tokens from seeing the padding after them), so attention runs over
    this forward's own keys. For a decode step, (batch, 1, 1, length) bool: which cached
    positions each row's token sees; decode rows are slots 0..batch-1 in order, so the cache is
    read as a view, never gathered.
    """

    keys: torch.Tensor
    values: torch.Tensor
    slots: torch.Tensor
    positions: torch.Tensor
    decode_mask: torch.Tensor | None

    def write(self, k: torch.Tensor, v: torch.Tensor) -> None:
        # k, v: (batch, kv_heads, seq, head_dim); the indexed cache view is (batch, seq, kv_heads, head_dim).
        rows = self.slots[:, None]
        self.keys[rows, :, self.positions] = k.transpose(1, 2)
        self.values[rows, :, self.positions] = v.transpose(1, 2)

    def read(self) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.decode_mask is not None
        batch, length = self.decode_mask.shape[0], self.decode_mask.shape[-1]
        return self.keys[:batch, :, :length], self.values[:batch, :, :length]


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.n_heads = config.num_attention_heads
        self.n_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        # q, k and v in one matrix (rows: q heads, then k heads, then v heads): one matmul
        # instead of three, forward and backward. Stored split, as q_proj/k_proj/v_proj
        # (see weights.py).
        self.qkv_proj = nn.Linear(config.hidden_size, (self.n_heads + 2 * self.n_kv_heads) * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, config.hidden_size, bias=False)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: LayerCache | None = None
    ) -> torch.Tensor:
        batch, seq, _ = x.shape
        qkv = self.qkv_proj(x).view(batch, seq, self.n_heads + 2 * self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k, v = qkv.split([self.n_heads, self.n_kv_heads, self.n_kv_heads], dim=1)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        # Grouped-query attention: each key/value head serves n_heads / n_kv_heads query heads.
        gqa = self.n_kv_heads != self.n_heads
        if cache is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        elif cache.decode_mask is None:  # prefill: the prompt attends to itself
            cache.write(k, v)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        else:  # decode: each row's token attends to its own cached positions
            cache.write(k, v)
            keys, values = cache.read()
            y = F.scaled_dot_product_attention(q, keys, values, attn_mask=cache.decode_mask, enable_gqa=gqa)
        return self.o_proj(y.transpose(1, 2).reshape(batch, seq, self.n_heads * self.head_dim))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        # gate and up in one matrix (gate rows first), stored split as gate_proj/up_proj.
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: LayerCache | None = None
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaBody(nn.Module):
    """`model.*` in transformers' naming: embeddings, layers, final norm."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class _CrossEntropy(torch.autograd.Function):
    """F.cross_entropy(logits, targets, ignore_index=-100) with a leaner backward.

    The gradient of the mean loss is (softmax - one_hot(target)) / count per row. Autograd's
    version fills a zero tensor the size of the logits, scatters into it, then runs
    log_softmax's backward: three passes over the largest tensor of the step. Here the saved
    log-probabilities are turned into the gradient in place, in two.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        valid = targets != -100
        safe_targets = targets.masked_fill(~valid, 0)
        log_probs = torch.log_softmax(logits, dim=-1)
        count = valid.sum()
        picked = log_probs.gather(1, safe_targets[:, None]).squeeze(1)
        ctx.save_for_backward(log_probs, safe_targets, valid, count)
        return -(picked * valid).sum() / count

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        # Overwrites the saved log-probabilities: a second backward through the same graph
        # fails loudly (autograd sees the changed version), it cannot go wrong silently.
        log_probs, safe_targets, valid, count = ctx.saved_tensors
        scale = (grad / count) * valid
        result = log_probs.exp_().mul_(scale[:, None])
        result.scatter_add_(1, safe_targets[:, None], -scale[:, None])
        return result, None


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of (N, vocab) fp32 logits against (N,) targets, skipping -100."""
    return _CrossEntropy.apply(logits, targets)


class LlamaForCausalLM(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaBody(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        # cos/sin of every position, made on the first cached forward (a plain attribute, not a
        # buffer: it is derived from the config and never saved).
        self._rotary: tuple[torch.Tensor, torch.Tensor] | None = None
        self.apply(self._init_weights)
        # Scaled init of the residual projections (GPT-2 / nanoGPT): keeps the residual
        # stream's variance from growing with depth.
        for name, param in self.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                nn.init.normal_(param, mean=0.0, std=0.02 / math.sqrt(2 * config.num_hidden_layers))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_parameters(self) -> int:
        """Unique parameters: a tied embedding counts once."""
        return sum(p.numel() for p in {id(p): p for p in self.parameters()}.values())

    def forward(
        self, input_ids: torch.Tensor, targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits for every position; with targets, also the mean next-token cross-entropy."""
        seq = input_ids.shape[1]
        if seq > self.config.max_position_embeddings:
            raise ValueError(
                f"sequence of {seq} tokens exceeds max_position_embeddings {self.config.max_position_embeddings}"
            )
        x = self.model.embed_tokens(input_ids)
        cos, sin = rotary_tables(self.config, torch.arange(seq, device=input_ids.device), x.dtype)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        logits = self.lm_head(self.model.norm(x))
        loss = None
        if targets is not None:
            loss = cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss

    @torch.no_grad()
    def forward_cached(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        cache_keys: list[torch.Tensor],
        cache_values: list[torch.Tensor],
        decode_mask: torch.Tensor | None = None,
        last_index: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Next-token logits (batch, vocab), reading and writing the KV cache (see LayerCache).

        input_ids and positions: (batch, seq). A prefill passes right-padded prompts and
        `last_index` (batch,), each prompt's last real position; a decode step passes one token
        per row (seq = 1) and `decode_mask`.
        """
        x = self.model.embed_tokens(input_ids)
        cos_table, sin_table = self._rotary_table(x)
        # Looked up, not recomputed: a decode step is a few hundred small ops, each one counts.
        cos, sin = cos_table[positions].unsqueeze(1), sin_table[positions].unsqueeze(1)  # (batch, 1, seq, head_dim)
        for layer, keys, values in zip(self.model.layers, cache_keys, cache_values, strict=True):
            x = layer(x, cos, sin, LayerCache(keys, values, slots, positions, decode_mask))
        if last_index is not None:
            x = x[torch.arange(x.shape[0], device=x.device), last_index]  # only the logits we sample from
        else:
            x = x[:, -1]
        return self.lm_head(self.model.norm(x))

    def _rotary_table(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin for positions 0..max_position_embeddings (one past the last: the KV
        pool's scratch position), the same numbers rotary_tables gives for any subset."""
        if self._rotary is None or self._rotary[0].device != x.device or self._rotary[0].dtype != x.dtype:
            positions = torch.arange(self.config.max_position_embeddings + 1, device=x.device)
            self._rotary = rotary_tables(self.config, positions, x.dtype)
        return self._rotary

    @torch.no_grad()
    def generate_greedy(self, input_ids: torch.Tensor, max_new_tokens: int) -> torch.Tensor:
        """Greedy continuation without a cache: the reference the serving engine must match."""
        for _ in range(max_new_tokens):
            window = input_ids[:, -self.config.max_position_embeddings :]
            logits, _ = self(window)
            input_ids = torch.cat([input_ids, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
        return input_ids


def expected_parameters(config: LlamaConfig) -> int:
    """Parameter count from the config alone, to check a checkpoint against."""
    h, kv = config.hidden_size, config.num_key_value_heads * config.head_dim
    per_layer = 2 * h * h + 2 * h * kv + 3 * h * config.intermediate_size + 2 * h
    embeddings = config.vocab_size * h * (1 if config.tie_word_embeddings else 2)
    return embeddings + config.num_hidden_layers * per_layer + h

"""A Llama-architecture decoder in plain PyTorch, in the spirit of nanoGPT's model.py.

Token embedding -> N x [RMSNorm -> grouped-query attention with rotary positions -> residual,
RMSNorm -> SwiGLU MLP -> residual] -> RMSNorm -> LM head (optionally tied to the embedding).

`forward` is the reference (training, evaluation, `generate_greedy`). The serving engine runs
the same network over a preallocated key/value cache (aieng_core/serving/kv_cache.py):
`forward_cached` is a prefill, writing each prompt's keys and values into its sequence's slot;
`decode_forward` runs every running sequence's next token, each at its own position, in one
batched forward. A decode step is a few hundred small ops, so its path is the lean one: one
fused norm per norm, rotary on queries and keys together, attention as two batched matmuls
per group of rows (decode_attention.py: each group attends up to its own longest row).

Parameter and config names are those of transformers' LlamaForCausalLM, except that q/k/v
and gate/up are each one matrix here (fewer, larger matmuls: faster training on CPU).
weights.py splits them on save and stacks them on load, so the safetensors we write load
in transformers unchanged, and theirs load here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import NamedTuple, cast

import torch
import torch.nn as nn
import torch.nn.functional as F

from aieng_core.model.decode_attention import decode_attention, group_lengths
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

    def fused(self, x: torch.Tensor) -> torch.Tensor:
        """The same numbers through torch's one-op rms_norm (inference only: training keeps
        the explicit form above, whose gradients the checkpoints were trained with)."""
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


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


def signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """sin with rotate_half's minus sign folded in: (-sin_a, sin_b) for halves (sin_a, sin_b)."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def apply_rotary_signed(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """apply_rotary in three ops instead of six: swapping the halves and multiplying by the
    signed sin gives rotate_half(x) * sin exactly (a sign change rounds nothing)."""
    half = x.shape[-1] // 2
    swapped = x.unflatten(-1, (2, half)).flip(-2).flatten(-2)
    return torch.addcmul(x * cos, swapped, sin_signed)


class PrefillSegment(NamedTuple):
    """One prompt chunk of a packed prefill: tokens start..start+length-1 of the packed
    sequence are positions offset..offset+length-1 of cache slot `slot`."""

    start: int
    length: int
    offset: int  # the prompt's tokens already in the cache (chunked prefill); 0 for a first chunk
    slot: int


class PrefillBatch(NamedTuple):
    """What every layer of a packed prefill shares: the admitted prompt chunks one after the
    other as one sequence of T tokens, no padding between them.

    slots, positions: (T,), where each token's key and value go. cos, sin_signed: (T, 1,
    head_dim) rotary factors at those positions. segments: the chunks. masks: for a chunk with
    cached tokens before it, (length, offset + length), True where a token sees a position.
    """

    slots: torch.Tensor
    positions: torch.Tensor
    cos: torch.Tensor
    sin_signed: torch.Tensor
    segments: tuple[PrefillSegment, ...]
    masks: tuple[torch.Tensor | None, ...]


class DecodeBatch(NamedTuple):
    """What every layer of a decode step shares. Row i of the step is cache slot i, so the
    cache is read as a view (slots 0..batch-1), never gathered.

    rows: (batch,) 0..batch-1. positions: (batch,) where each row's token goes.
    cos, sin_signed: (batch, 1, head_dim) rotary factors at those positions (see
    apply_rotary_signed). biases: one per attention group of consecutive rows
    (decode_attention.py), decode_attention's bias for the group: the group's rows are its first
    dim over kv_heads, its attended length its last.
    """

    rows: torch.Tensor
    positions: torch.Tensor
    cos: torch.Tensor
    sin_signed: torch.Tensor
    biases: tuple[torch.Tensor, ...]


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

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        qkv = self.qkv_proj(x).view(batch, seq, self.n_heads + 2 * self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k, v = qkv.split([self.n_heads, self.n_kv_heads, self.n_kv_heads], dim=1)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        # Grouped-query attention: each key/value head serves n_heads / n_kv_heads query heads.
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.n_kv_heads != self.n_heads)
        return self.o_proj(y.transpose(1, 2).reshape(batch, seq, self.n_heads * self.head_dim))

    def prefill(self, x: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, batch: PrefillBatch) -> torch.Tensor:
        """x: (T, hidden), the packed chunks; their keys and values go into the cache, and each
        chunk attends causally to its own prompt only (its cached start, then itself)."""
        tokens = x.shape[0]
        qkv = self.qkv_proj(x).view(tokens, self.n_heads + 2 * self.n_kv_heads, self.head_dim)
        qk, v = qkv.split([self.n_heads + self.n_kv_heads, self.n_kv_heads], dim=1)
        q, k = apply_rotary_signed(qk, batch.cos, batch.sin_signed).split([self.n_heads, self.n_kv_heads], dim=1)
        keys[batch.slots, :, batch.positions] = k
        values[batch.slots, :, batch.positions] = v
        gqa = self.n_kv_heads != self.n_heads
        y = torch.empty_like(q)
        for segment, mask in zip(batch.segments, batch.masks, strict=True):
            rows = slice(segment.start, segment.start + segment.length)
            queries = q[rows].transpose(0, 1)  # (heads, length, head_dim)
            if mask is None:  # a whole prompt, or its first chunk: it attends to itself
                out = F.scaled_dot_product_attention(
                    queries, k[rows].transpose(0, 1), v[rows].transpose(0, 1), is_causal=True, enable_gqa=gqa
                )
            else:  # a later chunk: its prompt's cached keys, then its own
                seen = segment.offset + segment.length
                out = F.scaled_dot_product_attention(
                    queries,
                    keys[segment.slot, :, :seen],
                    values[segment.slot, :, :seen],
                    attn_mask=mask,
                    enable_gqa=gqa,
                )
            y[rows] = out.transpose(0, 1)
        return self.o_proj(y.view(tokens, self.n_heads * self.head_dim))

    def decode(self, x: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, step: DecodeBatch) -> torch.Tensor:
        """x: (batch, hidden), one token per row; its key and value go into the cache first."""
        batch = x.shape[0]
        qkv = self.qkv_proj(x).view(batch, self.n_heads + 2 * self.n_kv_heads, self.head_dim)
        qk, v = qkv.split([self.n_heads + self.n_kv_heads, self.n_kv_heads], dim=1)
        q, k = apply_rotary_signed(qk, step.cos, step.sin_signed).split([self.n_heads, self.n_kv_heads], dim=1)
        keys[step.rows, :, step.positions] = k
        values[step.rows, :, step.positions] = v
        groups, start = [], 0
        for bias in step.biases:  # each group of rows attends up to its own length
            rows, length = bias.shape[0] // self.n_kv_heads, bias.shape[-1]
            end = start + rows
            cached = keys[start:end, :, :length], values[start:end, :, :length]
            groups.append(decode_attention(q[start:end], *cached, bias))
            start = end
        return self.o_proj(groups[0] if len(groups) == 1 else torch.cat(groups))


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

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))

    def prefill(self, x: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, batch: PrefillBatch) -> torch.Tensor:
        x = x + self.self_attn.prefill(self.input_layernorm.fused(x), keys, values, batch)
        return x + self.mlp(self.post_attention_layernorm.fused(x))

    def decode(self, x: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, step: DecodeBatch) -> torch.Tensor:
        x = x + self.self_attn.decode(self.input_layernorm.fused(x), keys, values, step)
        return x + self.mlp(self.post_attention_layernorm.fused(x))


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
        # cos, sin and signed sin of every position, made on the first cached forward (a plain
        # attribute, not a buffer: it is derived from the config and never saved).
        self._rotary: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        # How the weights were stored: "fp32", or "int8" for an int8 variant's, turned back into
        # float32 at load (model/int8_weights.py). The arithmetic is float32 either way.
        self.stored_weights = "fp32"
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
    def prefill_packed(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        segments: tuple[PrefillSegment, ...],
        cache_keys: list[torch.Tensor],
        cache_values: list[torch.Tensor],
        last_rows: torch.Tensor,
    ) -> torch.Tensor:
        """A prefill of prompt chunks packed into one sequence (see PrefillBatch), writing the
        KV cache: next-token logits (len(last_rows), vocab) at the packed rows `last_rows` (the
        last token of each chunk that ends its prompt). input_ids, positions, slots: (T,)."""
        x = self.model.embed_tokens(input_ids)
        cos_table, _, sin_signed_table = self._rotary_table(x)
        masks = tuple(
            None
            if segment.offset == 0
            else torch.arange(segment.offset + segment.length, device=x.device)[None, :]
            <= torch.arange(segment.offset, segment.offset + segment.length, device=x.device)[:, None]
            for segment in segments
        )
        batch = PrefillBatch(
            slots,
            positions,
            cos_table[positions].unsqueeze(1),
            sin_signed_table[positions].unsqueeze(1),
            segments,
            masks,
        )
        for layer, keys, values in zip(self.model.layers, cache_keys, cache_values, strict=True):
            x = cast(DecoderLayer, layer).prefill(x, keys, values, batch)
        return self.lm_head(self.model.norm.fused(x[last_rows]))

    def decode_biases(self, lengths: Sequence[int], sizes: Sequence[int], minimum: int = 1) -> list[torch.Tensor]:
        """decode_attention's bias of each attention group: the group's rows attend `lengths`
        positions each, over the group's longest length (at least `minimum`)."""
        device = self.model.embed_tokens.weight.device
        biases, start = [], 0
        for size, length in zip(sizes, group_lengths(lengths, sizes, minimum), strict=True):
            rows = torch.tensor(lengths[start : start + size], device=device)
            biases.append(self.decode_bias(rows, length))
            start += size
        return biases

    def decode_bias(self, lengths: torch.Tensor, length: int) -> torch.Tensor:
        """decode_attention's bias for rows attending `lengths` positions each, over the first
        `length` cached positions: (batch * kv_heads, groups, length), 0 or -inf."""
        batch, kv_heads = lengths.shape[0], self.config.num_key_value_heads
        groups = self.config.num_attention_heads // kv_heads
        sees = torch.arange(length, device=lengths.device) < lengths[:, None]
        dtype = self.model.embed_tokens.weight.dtype
        bias = torch.zeros(sees.shape, dtype=dtype, device=lengths.device).masked_fill_(~sees, float("-inf"))
        return bias[:, None, None].expand(batch, kv_heads, groups, length).flatten(0, 1)

    @torch.no_grad()
    def decode_forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        biases: Sequence[torch.Tensor],
        cache_keys: list[torch.Tensor],
        cache_values: list[torch.Tensor],
    ) -> torch.Tensor:
        """One token for each of the cache's slots 0..batch-1 (input_ids, positions: each row's
        token and where its key and value go), given its attention groups' biases
        (decode_biases): next-token logits (batch, vocab). Tensors in, logits out, no value read
        back to Python, so serving/step_graphs.py can compile it for one batch size with each
        group's attended length left dynamic."""
        x = self.model.embed_tokens(input_ids)
        cos_table, _, sin_signed_table = self._rotary_table(x)
        step = DecodeBatch(
            rows=torch.arange(x.shape[0], device=x.device),
            positions=positions,
            cos=cos_table[positions].unsqueeze(1),
            sin_signed=sin_signed_table[positions].unsqueeze(1),
            biases=tuple(biases),
        )
        for layer, keys, values in zip(self.model.layers, cache_keys, cache_values, strict=True):
            x = cast(DecoderLayer, layer).decode(x, keys, values, step)
        return self.lm_head(self.model.norm.fused(x))

    def _rotary_table(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """cos, sin and signed sin for positions 0..max_position_embeddings (one past the last:
        the KV pool's scratch position), the numbers rotary_tables gives for any subset. Looked
        up, not recomputed: a decode step is a few hundred small ops, each one counts."""
        if self._rotary is None or self._rotary[0].device != x.device or self._rotary[0].dtype != x.dtype:
            positions = torch.arange(self.config.max_position_embeddings + 1, device=x.device)
            cos, sin = rotary_tables(self.config, positions, x.dtype)
            self._rotary = (cos, sin, signed_sin(sin))
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

"""int8 weights: the linear layers of a model stored as int8 with one scale per output row.

The method (METHOD, named in every int8 bundle and report) is weight-only: each linear weight
(q/k/v, o, gate/up, down and lm_head) is quantized symmetrically per output channel, scale =
max|row| / 127, int8 = round(w / scale) in [-127, 127]; embeddings and norms stay float32; a
tied lm_head gets an int8 copy of the embedding matrix of its own. Loading turns the integers
back into float32 weights once (int8 x scale), and every matmul runs in float32 as the float32
model's do, captured step graphs included.

Why not int8 matmuls: torch's dynamic quantized Linear (fbgemm) was measured 1.4-1.6x faster
at batch 16 and 64 on the pipeline model, but it quantizes the activations with one scale for
the whole batch, so a request's tokens depend on what shares its batch: the promotion gate's
rollback drill saw 2 of 4 goldens differ under light traffic. A request's answer must never
depend on its neighbours (seeded sampling and golden replay rely on it), and torch has no
per-row int8 matmul on the CPU that is faster than float32 (torch._int_mm and
_weight_int8pack_mm were both slower). So the variant halves the bundle's weights and
measures what int8 weights cost in quality; it does not claim int8 speed.

The file is a plain safetensors file in transformers' names (q_proj, k_proj, ... split as the
float32 file is): `<name>.weight` holds the int8 rows and `<name>.weight_scale` their float32
scales, and the metadata says `aieng_weights: int8`. A loaded model and an in-memory quantized
one (`quantized_copy`) are computed from the same integers and scales: they are identical.
No pickle anywhere.
"""

from __future__ import annotations

import torch
from torch import nn

from aieng_core.model.llama import LlamaForCausalLM
from aieng_core.model.weights import load_into, unique_state_dict

INT8 = "int8"
FP32 = "fp32"
WEIGHTS_METADATA_KEY = "aieng_weights"
SCALE_SUFFIX = "_scale"
METHOD = (
    "weight-only int8: linear weights symmetric per output channel (scale = max|row| / 127), stored int8 and "
    "turned back into float32 once at load; matmuls, embeddings and norms float32"
)


def is_linear_weight(name: str) -> bool:
    """A stored (transformers) name of a linear layer's weight: what int8 quantizes."""
    return name == "lm_head.weight" or name.endswith("_proj.weight")


def quantize_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 rows, float32 scale per row) of a float weight: symmetric, absmax / 127."""
    weight = weight.detach().to(torch.float32)
    # An all-zero row gets scale 1 (its integers are all 0 whatever the scale).
    scale = weight.abs().amax(dim=1) / 127.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    values = torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return values, scale


def int8_state_dict(model: LlamaForCausalLM) -> dict[str, torch.Tensor]:
    """What an int8 model.safetensors holds, from a float32 model: every linear weight as int8
    rows plus `_scale`, a tied lm_head included; everything else as it is."""
    if is_int8_model(model):
        raise ValueError("the model's weights are an int8 variant's already: quantize its float32 source")
    state = unique_state_dict(model)
    if model.config.tie_word_embeddings:
        state["lm_head.weight"] = model.lm_head.weight.detach().clone()
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if is_linear_weight(name):
            values, scale = quantize_rows(tensor)
            out[name], out[name + SCALE_SUFFIX] = values.contiguous(), scale.contiguous()
        else:
            out[name] = tensor.contiguous()
    return out


def int8_model(model: LlamaForCausalLM, tensors: dict[str, torch.Tensor]) -> LlamaForCausalLM:
    """Load int8 `tensors` (int8_state_dict's layout) into `model` (built on the meta device):
    every linear weight becomes int8 x its row scales in float32, a tied lm_head an untied
    layer of its own (its int8 copy of the embeddings)."""
    weights: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        if name.endswith(SCALE_SUFFIX):
            if not is_linear_weight(name[: -len(SCALE_SUFFIX)]) or name[: -len(SCALE_SUFFIX)] not in tensors:
                raise ValueError(f"int8 weights: {name} scales no int8 linear weight")
            continue
        if not is_linear_weight(name):
            if tensor.dtype != torch.float32:
                raise ValueError(f"int8 weights: {name} is {tensor.dtype}, not float32")
            weights[name] = tensor
            continue
        weights[name] = dequantize(name, tensor, tensors.get(name + SCALE_SUFFIX))
    lm_head = weights.pop("lm_head.weight", None)
    if lm_head is None:
        raise ValueError("int8 weights: lm_head.weight is missing")
    if not model.config.tie_word_embeddings:
        weights["lm_head.weight"] = lm_head
    load_into(model, weights, assign=True)
    if model.config.tie_word_embeddings:
        model.lm_head = nn.Linear(model.config.hidden_size, model.config.vocab_size, bias=False, device="meta")
        model.lm_head.weight = nn.Parameter(lm_head, requires_grad=False)
    model.stored_weights = INT8
    return model.eval()


def dequantize(name: str, values: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """float32 weight `name` from its int8 rows and their scales, each checked first."""
    if values.dtype != torch.int8 or values.dim() != 2:
        raise ValueError(f"int8 weights: {name} is a {values.dim()}-d {values.dtype} tensor, not 2-d int8")
    if scale is None:
        raise ValueError(f"int8 weights: {name} has no {name}{SCALE_SUFFIX}")
    if scale.dtype != torch.float32 or tuple(scale.shape) != (values.shape[0],):
        raise ValueError(
            f"int8 weights: {name}{SCALE_SUFFIX} is {scale.dtype} of shape {tuple(scale.shape)}, not one float32 "
            f"scale per row of {name} {tuple(values.shape)}"
        )
    if not bool(torch.isfinite(scale).all()) or not bool((scale > 0).all()):
        raise ValueError(f"int8 weights: {name}{SCALE_SUFFIX} holds a scale that is not finite and above 0")
    return values.to(torch.float32) * scale[:, None]


def quantized_copy(model: LlamaForCausalLM) -> LlamaForCausalLM:
    """The int8 model of a float32 one (the same as saving int8_state_dict and loading it)."""
    tensors = int8_state_dict(model)
    with torch.device("meta"):
        empty = LlamaForCausalLM(model.config)
    return int8_model(empty, tensors)


def is_int8_model(model: LlamaForCausalLM) -> bool:
    return model.stored_weights == INT8

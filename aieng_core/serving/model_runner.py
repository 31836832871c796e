"""The model runner: how one engine step runs on the model (the scheduler decides who runs).

A step is at most two batched forwards: one prefill of this step's prompt chunks packed into
one sequence, with no padding (LlamaForCausalLM.prefill_packed: each chunk writes its keys and
values into its own slot and attends to its own prompt only), and one decode over every
running sequence (LlamaForCausalLM.decode_forward). Decode rows are the pool's slots
0..n-1, the range in use (the pool hands out the lowest free slot, so it stays packed): the
cached keys are read as a view, each row masked to its own length, and the rows attend in a
few groups of consecutive slots, each up to its own longest row (model/decode_attention.py); the
decoding requests are re-seated by length when that pays (slot_order.py). A slot in that range
with no decoding sequence (free, or just prefilled this step) runs a dummy token that writes
to the pool's scratch position, so it never touches a live sequence's keys. A decode whose
rows fit a captured bucket (step_graphs.py) runs that bucket's compiled graph, the rows above
its own as idle rows; any other runs eagerly. Then sampling.sample picks one token per
request: a step plan in, sampled tokens out.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from aieng_core.model.decode_attention import attention_cells, group_lengths
from aieng_core.model.llama import LlamaForCausalLM, PrefillSegment
from aieng_core.serving.kv_cache import KVCachePool
from aieng_core.serving.prefix_cache import PrefixCache
from aieng_core.serving.request import NO_TOKEN, Request, SampledTokens, StepPlan
from aieng_core.serving.sampling import sample
from aieng_core.serving.slot_order import regroup, step_lengths
from aieng_core.serving.step_graphs import MIN_LENGTH, StepGraphs, StepGraphSettings


class ModelRunner:
    """Owns the model it is given: its matrices are laid out for inference (see below)."""

    def __init__(
        self,
        model: LlamaForCausalLM,
        pool: KVCachePool,
        graphs: StepGraphSettings = StepGraphSettings(),
        bundle_key: str = "unbundled",
        prefix_cache: PrefixCache | None = None,
    ) -> None:
        self.model = lay_out_for_inference(model)
        self.pool = pool
        self.prefix_cache = prefix_cache
        self.device = next(model.parameters()).device
        self.pad_id = model.config.pad_token_id
        # Empty until warmup captures them (Engine.warmup): every step runs eagerly until then.
        self.graphs = StepGraphs(self.model, pool, graphs, bundle_key)
        self.captured_steps = 0  # decode steps run in a captured graph, since start
        self.eager_steps = 0  # decode steps run eagerly (no graph for their bucket at their thread count), since start
        self.moved_rows = 0  # decoding requests re-seated by length (slot_order.py), since start
        # The last decode step's attended positions: the rows' own, and all, padding included.
        self.last_attention = (0, 0)

    def run(self, plan: StepPlan) -> SampledTokens:
        started = time.perf_counter()
        tokens: list[int] = []
        if plan.prefill:
            tokens += self.prefill(plan.prefill, plan.forks, plan.fork_sources)
        if plan.decode:
            tokens += sample(self.decode_logits(plan.decode), plan.decode)
        return SampledTokens(
            tokens=tuple(tokens),
            prefill_tokens=sum(r.prefill_length for r in plan.prefill),
            decode_tokens=len(plan.decode),
            forward_seconds=time.perf_counter() - started,
        )

    def prefill(
        self, requests: Sequence[Request], forks: Sequence[Request] = (), sources: Sequence[Request] = ()
    ) -> list[int]:
        """Each request's chunk into its slot; the first token of each whose chunk ends its
        prompt, NO_TOKEN for the others (their prompts continue next step); then the first token
        of each fork, sampled from its source's logits after a copy of its source's prompt."""
        completing = [r for r in requests if r.prefill_completes]
        if self.prefix_cache is not None:  # the cached prefixes the scheduler found, into their slots
            for request in requests:
                self.prefix_cache.load(request)
        logits = self.prefill_logits(requests)
        if self.prefix_cache is not None:  # the blocks each chunk completed, for the next prompts
            for request in requests:
                self.prefix_cache.store(request, request.prefill_start + request.prefill_length)
        if forks:
            row_of = {id(r): row for row, r in enumerate(completing)}
            for fork, source in zip(forks, sources, strict=True):
                self.pool.copy(_slot(source), _slot(fork), source.num_prompt_tokens)
            rows = torch.tensor([row_of[id(source)] for source in sources], device=logits.device)
            logits = torch.cat([logits, logits.index_select(0, rows)])
        sampled = iter(sample(logits, [*completing, *forks]) if completing else [])
        tokens = [next(sampled) if r.prefill_completes else NO_TOKEN for r in requests]
        return tokens + list(sampled)

    @torch.inference_mode()
    def prefill_logits(self, requests: Sequence[Request]) -> torch.Tensor:
        """Writes each request's chunk (prefill_start, prefill_length) into its slot; logits for
        the next token of each request whose chunk ends its prompt, (n, vocab) in order."""
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        segments: list[PrefillSegment] = []
        last_rows: list[int] = []
        for request in requests:
            start, length, slot = request.prefill_start, request.prefill_length, _slot(request)
            segments.append(PrefillSegment(len(ids), length, start, slot))
            ids += request.prompt_ids[start : start + length]
            positions += range(start, start + length)
            slots += [slot] * length
            if request.prefill_completes:
                last_rows.append(len(ids) - 1)
        return self.model.prefill_packed(
            torch.tensor(ids, device=self.device),
            torch.tensor(positions, device=self.device),
            torch.tensor(slots, device=self.device),
            tuple(segments),
            self.pool.keys,
            self.pool.values,
            torch.tensor(last_rows, dtype=torch.long, device=self.device),
        )

    @torch.inference_mode()
    def decode_logits(self, requests: Sequence[Request]) -> torch.Tensor:
        """One token for each request (its last, at position num_tokens - 1); logits (n, vocab)
        in the order of `requests`."""
        rows = max(_slot(r) for r in requests) + 1
        bucket = self.graphs.bucket_for(rows)
        captured = self.graphs.has(bucket)
        if captured:
            rows = bucket  # the rows above the step's own run idle
        sizes = self.graphs.group_sizes(rows)
        self.moved_rows += regroup(self.pool, requests, sizes)
        lengths = step_lengths(requests, rows)
        minimum = MIN_LENGTH if captured else 1
        captured = captured and self.graphs.runnable(bucket, group_lengths(lengths, sizes, minimum))
        self.last_attention = (sum(r.num_tokens for r in requests), attention_cells(lengths, sizes, minimum))
        # An idle row writes to the scratch position and sees position 0 only (finite zeros or
        # stale keys: its output is thrown away).
        ids = [self.pad_id] * rows
        positions = [self.pool.scratch_position] * rows
        for request in requests:
            slot = _slot(request)
            ids[slot], positions[slot] = request.last_token, request.num_tokens - 1
        ids_t = torch.tensor(ids, device=self.device)
        positions_t = torch.tensor(positions, device=self.device)
        biases = self.model.decode_biases(lengths, sizes, minimum)
        if captured:
            logits = self.graphs.decode(bucket, ids_t, positions_t, biases)
            self.captured_steps += 1
        else:
            logits = self.model.decode_forward(ids_t, positions_t, biases, self.pool.keys, self.pool.values)
            self.eager_steps += 1
        if len(requests) == rows and all(_slot(r) == row for row, r in enumerate(requests)):
            return logits
        return logits[torch.tensor([_slot(r) for r in requests], device=self.device)]


def lay_out_for_inference(model: LlamaForCausalLM) -> LlamaForCausalLM:
    """Stores each linear layer's matrix transposed in memory: same shape and values,
    column-major strides, so F.linear multiplies by a contiguous (in, out) matrix.

    A decode step multiplies a few rows by every matrix of the model, so it is bound by how
    fast the weights stream from memory; on the CPUs measured here the (in, out) layout streams
    faster (a batch-1 step about 1.5x faster; larger batches unchanged). In place, on the same
    parameters (a tied embedding stays tied); numbers can differ from the row-major product in
    the last bits, as any change of kernel can.
    """
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear) and module.weight.is_contiguous():
                module.weight.data = module.weight.data.t().contiguous().t()
    return model


def _slot(request: Request) -> int:
    if request.slot is None:
        raise RuntimeError(f"request {request.request_id} is scheduled but holds no KV-cache slot")
    return request.slot

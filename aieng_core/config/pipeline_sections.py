"""The sections of the config that the data and model stages read: data, tokenizer, dataset,
model, training. Each is hashed into the ids of the artifacts that read it."""

from __future__ import annotations

import codecs
import datetime as dt
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from aieng_core.model.shape import head_shape_problem


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class DataConfig(Section):
    """raw_documents and clean_documents: the landing folder's partitions, the data contract's
    bounds, decoding, and how much is held in memory at once."""

    start_date: dt.date = Field(default=dt.date(2026, 1, 1), strict=False, description="The first daily partition.")
    min_chars: int = Field(default=20, ge=0, description="Shorter clean texts are quarantined as too_short.")
    max_chars: int = Field(default=200_000, ge=1, description="Longer clean texts are quarantined as too_long.")
    batch_rows: int = Field(default=4096, ge=1, le=1_000_000, description="Rows per streamed record batch.")
    batch_bytes: int = Field(
        default=64 << 20,
        ge=1 << 16,
        description="Bytes of records held per batch: with batch_rows, bounds memory whatever the rows hold.",
    )
    max_record_bytes: int = Field(
        default=8 << 20,
        ge=1024,
        description="A record (a line, a CSV record) over this many bytes is record_too_large, never parsed.",
    )
    max_file_bytes: int = Field(
        default=16 << 30,
        ge=1024,
        description="Decompressed bytes read from one landed file; the rest is quarantined as unreadable.",
    )
    fallback_encodings: tuple[str, ...] = Field(
        default=("gb18030",),
        strict=False,
        description="Tried in order after strict UTF-8; GB encodings only where the bytes look like Chinese.",
    )

    @model_validator(mode="after")
    def _bounds_ordered(self) -> DataConfig:
        if self.min_chars > self.max_chars:
            raise ValueError(f"min_chars ({self.min_chars}) must not exceed max_chars ({self.max_chars})")
        if self.max_record_bytes > self.max_file_bytes:
            raise ValueError(
                f"max_record_bytes ({self.max_record_bytes}) must not exceed max_file_bytes ({self.max_file_bytes})"
            )
        return self

    @field_validator("fallback_encodings")
    @classmethod
    def _known_encodings(cls, encodings: tuple[str, ...]) -> tuple[str, ...]:
        names = []
        for encoding in encodings:
            try:
                name = codecs.lookup(encoding).name
            except LookupError:
                raise ValueError(f"unknown encoding {encoding!r}") from None
            if name.startswith(("utf-8", "utf_8", "utf-16", "utf-32")):
                raise ValueError(f"{encoding!r}: UTF encodings are detected already (strict UTF-8, byte-order marks)")
            if name in names:
                raise ValueError(f"{encoding!r} is listed twice")
            names.append(name)
        return tuple(names)


class TokenizerConfig(Section):
    """bpe_tokenizer and tokenized_documents: the byte-level BPE trained from scratch."""

    vocab_size: int = Field(default=4096, ge=300, le=1_000_000, description="Tokens in the vocabulary.")
    min_frequency: int = Field(default=2, ge=1, description="A pair merged fewer times is not learned.")
    eos_token: str = Field(default="<|endoftext|>", min_length=1, description="Ends every document.")
    pad_token: str = Field(default="<|pad|>", min_length=1, description="Pads batches; never trained on.")
    max_training_chars: int = Field(default=50_000_000, ge=1, description="Cap on the clean text fed to BPE training.")

    @model_validator(mode="after")
    def _distinct_specials(self) -> TokenizerConfig:
        if self.eos_token == self.pad_token:
            raise ValueError("eos_token and pad_token must differ")
        return self


class DatasetConfig(Section):
    """dataset_manifest: the train/validation split of the tokenized partitions."""

    validation_fraction: float = Field(
        default=0.05, gt=0.0, lt=1.0, strict=False, description="Share of documents (by id) held out for validation."
    )
    split_seed: str = Field(
        default="aieng-split-v1", description="Seeds the split: a document's side depends only on its id and this."
    )


class ModelConfig(Section):
    """Shape of the Llama-architecture decoder; the vocabulary comes from the tokenizer."""

    hidden_size: int = Field(default=256, ge=8, description="Width of the residual stream.")
    intermediate_size: int = Field(default=688, ge=8, description="SwiGLU width.")
    num_hidden_layers: int = Field(default=4, ge=1, description="Decoder layers.")
    num_attention_heads: int = Field(default=8, ge=1, description="Query heads per layer.")
    num_key_value_heads: int = Field(
        default=4, ge=1, description="Key/value heads (grouped-query attention); divides num_attention_heads."
    )
    max_position_embeddings: int = Field(default=256, ge=8, description="The longest sequence the model takes.")
    rope_theta: float = Field(default=10000.0, gt=0, strict=False, description="Rotary embedding base.")
    rms_norm_eps: float = Field(default=1e-5, gt=0, strict=False, description="RMSNorm epsilon.")
    tie_word_embeddings: bool = Field(default=True, description="The output projection shares the input embedding.")

    @model_validator(mode="after")
    def _heads_fit(self) -> ModelConfig:
        if problem := head_shape_problem(self.hidden_size, self.num_attention_heads, self.num_key_value_heads):
            raise ValueError(problem)
        return self


class TrainingConfig(Section):
    """model_checkpoint: AdamW with linear warmup and cosine decay, resumable checkpoints."""

    block_size: int = Field(default=128, ge=2, description="Tokens per packed training sequence.")
    batch_size: int = Field(default=16, ge=1, description="Sequences per step.")
    max_steps: int = Field(default=400, ge=1, description="Training stops at max_steps or max_minutes, first come.")
    max_minutes: float = Field(
        default=9.0,
        gt=0,
        strict=False,
        description="A run stopped by this publishes a partial model; the next run resumes to max_steps.",
    )
    learning_rate: float = Field(default=2e-3, gt=0, strict=False, description="Peak learning rate.")
    min_learning_rate: float = Field(
        default=2e-4, ge=0, strict=False, description="Where the cosine decay ends; at most learning_rate."
    )
    warmup_steps: int = Field(default=40, ge=0, description="Linear warmup steps.")
    weight_decay: float = Field(default=0.1, ge=0, strict=False, description="AdamW weight decay.")
    beta1: float = Field(default=0.9, gt=0, lt=1, strict=False, description="AdamW beta1.")
    beta2: float = Field(default=0.95, gt=0, lt=1, strict=False, description="AdamW beta2.")
    grad_clip: float = Field(default=1.0, gt=0, strict=False, description="Gradient norm clip.")
    eval_every: int = Field(default=100, ge=1, description="Validation loss every N steps.")
    eval_batches: int = Field(default=8, ge=1, description="Validation batches per evaluation.")
    log_every: int = Field(default=25, ge=1, description="A progress line (loss, tokens/s, ETA) every N steps.")
    checkpoint_every: int = Field(default=100, ge=1, description="A resumable checkpoint every N steps.")
    seed: int = Field(default=1337, description="Initialisation and batch order.")
    threads: int = Field(
        default=0, ge=0, description="torch threads; 0: torch's default. Fix it for bit-identical reruns."
    )
    device: Literal["auto", "cpu", "cuda"] = Field(default="auto", description="auto: cuda when present, else cpu.")
    processes: int = Field(
        default=1,
        ge=1,
        le=64,
        description=(
            "Data-parallel training processes on this machine, launched with torchrun (gloo on CPU, NCCL on CUDA); "
            "each takes batch_size / processes sequences of every step's batch. Another count is another model."
        ),
    )

    @model_validator(mode="after")
    def _schedule_fits(self) -> TrainingConfig:
        if self.min_learning_rate > self.learning_rate:
            raise ValueError(
                f"min_learning_rate ({self.min_learning_rate}) must not exceed learning_rate ({self.learning_rate})"
            )
        if self.batch_size % self.processes:
            raise ValueError(
                f"batch_size ({self.batch_size}) must be a multiple of processes ({self.processes}): every process "
                f"takes an equal share of each step's batch"
            )
        return self

    @model_serializer(mode="wrap")
    def _one_process_unsaid(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # One process is what every model before this key was trained with: left out of the dump
        # (which the section's hash reads), a one-process training section hashes as it did.
        values: dict[str, Any] = handler(self)
        if values.get("processes") == 1:
            del values["processes"]
        return values

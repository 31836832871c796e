"""A byte-level BPE tokenizer trained from scratch with Hugging Face `tokenizers`.

Byte-level means every byte has a token, so no input is ever unknown: Chinese, emoji and
binary junk all round-trip. The directory written by `save_tokenizer_dir` is what
`transformers.AutoTokenizer.from_pretrained(dir)` expects (tokenizer.json plus
tokenizer_config.json naming the special tokens), with the pad token set.

Document text is always encoded as ordinary text: a literal "<|endoftext|>" inside a
document becomes the tokens of those 13 characters, never the EOS id, so only the pipeline
decides where a document ends. `tokenizers` keeps that switch (`encode_special_tokens`) out
of tokenizer.json, so `load_tokenizer` sets it on every load, and tokenizer_config.json
carries `split_special_tokens` so transformers' AutoTokenizer does the same.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from aieng_core.config import TokenizerConfig

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_FILE = "special_tokens_map.json"
TOKENIZER_FILES = (TOKENIZER_FILE, TOKENIZER_CONFIG_FILE, SPECIAL_TOKENS_FILE)


def train_bpe(texts: Iterable[str], config: TokenizerConfig, length: int | None = None) -> Tokenizer:
    """Train on an iterator of texts; the trainer streams them, it never needs them all at once.

    Deterministic: the same texts in the same order give the same vocabulary and merges.
    (The trainer already reads a literal "<|endoftext|>" in the texts as ordinary text.)
    """
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size,
        min_frequency=config.min_frequency,
        special_tokens=[config.eos_token, config.pad_token],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer, length=length)
    tokenizer.encode_special_tokens = True
    return tokenizer


def save_tokenizer_dir(tokenizer: Tokenizer, directory: Path, config: TokenizerConfig) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / TOKENIZER_FILE), pretty=False)
    specials = {
        "bos_token": config.eos_token,
        "eos_token": config.eos_token,
        "unk_token": config.eos_token,
        "pad_token": config.pad_token,
    }
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 1_000_000_000,
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,
        "add_eos_token": False,
        # Special-token text inside documents stays text, as with load_tokenizer.
        "split_special_tokens": True,
        **specials,
    }
    (directory / TOKENIZER_CONFIG_FILE).write_text(
        json.dumps(tokenizer_config, indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )
    (directory / SPECIAL_TOKENS_FILE).write_text(
        json.dumps(specials, indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )


def load_tokenizer(directory: Path) -> Tokenizer:
    """The tokenizer for document text. Use this, not Tokenizer.from_file: the switch that
    keeps special-token text in documents from becoming special ids is not saved in
    tokenizer.json and has to be set on every load."""
    tokenizer = Tokenizer.from_file(str(directory / TOKENIZER_FILE))
    tokenizer.encode_special_tokens = True
    return tokenizer


def special_ids(tokenizer: Tokenizer) -> set[int]:
    """Ids of the special tokens (EOS, pad): ids that document text must never encode to."""
    return {token_id for token_id, token in tokenizer.get_added_tokens_decoder().items() if token.special}


def special_token_id(tokenizer: Tokenizer, token: str) -> int:
    token_id = tokenizer.token_to_id(token)
    if token_id is None:
        raise ValueError(f"tokenizer has no special token {token!r}")
    return token_id


def capped(texts: Iterable[str], max_chars: int) -> Iterator[str]:
    """The texts in order until `max_chars` characters have been yielded (the last one whole)."""
    total = 0
    for text in texts:
        if total >= max_chars:
            return
        total += len(text)
        yield text


def round_trip_misses(tokenizer: Tokenizer, texts: list[str]) -> list[int]:
    """Positions of the texts that do not survive encoding as document text: their ids hold
    a special token, or do not decode back to exactly the text. Encodes as
    tokenized_documents does, in one batch across all cores; a byte-level BPE loaded with
    `load_tokenizer` must return none."""
    specials = special_ids(tokenizer)
    encoded = [encoding.ids for encoding in tokenizer.encode_batch_fast(texts, add_special_tokens=False)]
    # Special ids are decoded too (not skipped): the check above already fails them.
    decoded = tokenizer.decode_batch(encoded, skip_special_tokens=False)
    return [
        i
        for i, (text, ids, back) in enumerate(zip(texts, encoded, decoded))
        if back != text or not specials.isdisjoint(ids)
    ]


def round_trip_failures(tokenizer: Tokenizer, texts: Iterable[str]) -> list[str]:
    """The texts that do not survive encoding as document text (see round_trip_misses)."""
    texts = list(texts)
    return [texts[i] for i in round_trip_misses(tokenizer, texts)]

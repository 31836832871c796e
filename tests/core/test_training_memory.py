"""Training memory does not grow with the corpus: the train stream stays on disk.

A fresh process (its peak RSS is its own) trains two steps and computes the unigram
baseline on a small token file, which warms up everything that does not depend on the
corpus (torch, allocator, threads), then does the same on a 24M-token file. Its peak RSS
may not grow by more than an eighth of the int64 copy of that stream (192 MiB), nor by
half the file itself: holding the stream in RAM, or keeping a long-lived map of it whose
touched pages stay resident, fails this.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
BIG_TOKENS = 24_000_000
MIB = 1 << 20

SCRIPT = """
import json, resource, sys
from pathlib import Path
import numpy as np
from aieng_core.config import TrainingConfig
from aieng_core.model.llama import LlamaConfig
from aieng_core.training.corpus import TokenFile, unigram_cross_entropy
from aieng_core.training.trainer import train

work, big_tokens = Path(sys.argv[1]), int(sys.argv[2])
model = LlamaConfig(vocab_size=512, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=32, eos_token_id=0, bos_token_id=0, pad_token_id=1)
config = TrainingConfig(block_size=16, batch_size=4, max_steps=2, max_minutes=5, warmup_steps=1, eval_every=2,
                        eval_batches=1, log_every=1, checkpoint_every=100, seed=7, threads=1, device="cpu")
validation = TokenFile(work / "validation.bin", np.dtype("<u2"), 10_000)

def peak_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux

def run(name, tokens):
    stream = TokenFile(work / name, np.dtype("<u2"), tokens)
    unigram_cross_entropy(stream, validation, 512)
    train(model, config, stream, validation, work / ("run-" + name))

run("small.bin", 10_000)
before = peak_bytes()
run("big.bin", big_tokens)
print(json.dumps({"growth_bytes": peak_bytes() - before}))
"""


def write_tokens(path: Path, count: int, chunk: int = 1 << 20) -> None:
    """count tokens (0, 1, ..., 511, 0, ...) as little-endian uint16, a chunk at a time."""
    with open(path, "wb") as handle:
        for begin in range(0, count, chunk):
            (np.arange(begin, min(begin + chunk, count)) % 512).astype("<u2").tofile(handle)


def test_peak_memory_of_training_does_not_grow_with_the_train_stream(tmp_path: Path) -> None:
    write_tokens(tmp_path / "small.bin", 10_000)
    write_tokens(tmp_path / "validation.bin", 10_000)
    write_tokens(tmp_path / "big.bin", BIG_TOKENS)
    assert (tmp_path / "big.bin").stat().st_size == 2 * BIG_TOKENS
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path), str(BIG_TOKENS)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    growth = json.loads(result.stdout.splitlines()[-1])["growth_bytes"]
    int64_copy = 8 * BIG_TOKENS
    assert growth < int64_copy / 8, f"peak RSS grew by {growth / MIB:.1f} MiB"

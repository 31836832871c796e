"""File hashing of files we do not own: read, never mapped, so a shrinking file cannot kill us;
and hashes that must never change, since artifact ids are made of them."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from aieng_core.hashing import CHUNK_BYTES, ColumnHasher, sha256_file, sha256_stream
from tests.conftest import REPO_ROOT

# Hash a large file while another thread cuts it to zero bytes part-way through. With the
# file mapped into memory, touching the pages that no longer exist raises SIGBUS and the
# whole process dies; with plain reads the hash simply ends early.
SHRINK_WHILE_HASHING = """
import os, sys, threading, time
from aieng_core.hashing import sha256_file

path = sys.argv[1]
with open(path, "wb") as handle:
    handle.truncate(512 << 20)  # sparse: instant to make, still 512 MiB to hash

def shrink():
    time.sleep(0.02)
    os.truncate(path, 0)

thread = threading.Thread(target=shrink)
thread.start()
print(sha256_file(path))
thread.join()
"""


def test_a_file_that_shrinks_while_hashed_does_not_kill_the_process(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", SHRINK_WHILE_HASHING, str(tmp_path / "landing.jsonl")],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"hashing process died with {result.returncode}: {result.stderr[-2000:]}"
    assert len(result.stdout.strip()) == 64


@pytest.mark.skipif(not Path("/proc/version").is_file(), reason="needs Linux /proc")
def test_sha256_file_hashes_what_it_reads_not_what_stat_claims() -> None:
    # /proc files report a size of 0 but have content.
    path = Path("/proc/version")
    assert path.stat().st_size == 0
    assert sha256_file(path) == hashlib.sha256(path.read_bytes()).hexdigest() != hashlib.sha256(b"").hexdigest()


@pytest.mark.parametrize("size", [0, 1, CHUNK_BYTES - 1, CHUNK_BYTES, CHUNK_BYTES + 1, 3 * CHUNK_BYTES + 5])
def test_file_and_stream_hashes_equal_hashlib_across_chunk_boundaries(tmp_path: Path, size: int) -> None:
    data = bytes(range(256)) * (size // 256) + bytes(size % 256)
    path = tmp_path / "data.bin"
    path.write_bytes(data)
    with open(path, "rb") as handle:
        expected = hashlib.file_digest(handle, "sha256").hexdigest()
    assert sha256_file(path) == expected == hashlib.sha256(data).hexdigest()
    with open(path, "rb") as handle:  # buffered, as well as the raw file sha256_file opens
        assert sha256_stream(handle) == (expected, size)


def test_column_hash_is_pinned_and_independent_of_batch_boundaries() -> None:
    # A changed digest changes every artifact id: if this fails, the hash format changed.
    schema = pa.schema(
        [("id", pa.string()), ("text", pa.large_string()), ("line", pa.int64()), ("ids", pa.large_list(pa.int32()))]
    )
    batch = pa.RecordBatch.from_pydict(
        {"id": ["a", None, "ü"], "text": ["ab", "c", ""], "line": [1, None, -3], "ids": [[1, 2], None, []]},
        schema=schema,
    )
    whole, split = ColumnHasher(schema.names), ColumnHasher(schema.names)
    whole.update(batch)
    split.update(batch.slice(0, 2))
    split.update(batch.slice(2))
    assert whole.hexdigest() == split.hexdigest() == "0a59f647e6cb1b78267f8a30cc03e897d7f21a74c634be8fd7be877d27a3ab53"

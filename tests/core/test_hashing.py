"""File hashing of files we do not own: read, never mapped, so a shrinking file cannot kill us;
and hashes that must never change, since artifact ids are made of them."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from aieng_core.hashing import CHUNK_BYTES, ColumnHasher, sha256_file, sha256_stream
from tests.conftest import REPO_ROOT

# Hash a file of several chunks and cut it to zero bytes right after the first chunk went into
# the digest, before the hash is finished: a hook on hashlib.sha256 as aieng_core.hashing sees
# it does the truncation, in the hashing thread, at exactly that point. With the file mapped
# into memory, touching the pages that no longer exist raises SIGBUS and the whole process
# dies; with plain reads the hash simply ends early, at what was read before the cut.
SHRINK_WHILE_HASHING = """
import hashlib, json, os, sys
from aieng_core import hashing

path, chunks = sys.argv[1], int(sys.argv[2])
with open(path, "wb") as handle:
    handle.truncate(chunks * hashing.CHUNK_BYTES)  # sparse: instant to make, all zero bytes

updates = []  # (bytes fed to the digest, size of the file on disk right after)


class ShrinkAfterFirstChunk:
    def __init__(self, data=b""):
        self.digest = hashlib.sha256()
        if data:
            self.update(data)

    def update(self, data):
        self.digest.update(data)
        if not updates:
            os.truncate(path, 0)
        updates.append((len(data), os.stat(path).st_size))

    def hexdigest(self):
        return self.digest.hexdigest()


class HookedHashlib:
    sha256 = ShrinkAfterFirstChunk

    def __getattr__(self, name):
        return getattr(hashlib, name)


hashing.hashlib = HookedHashlib()
print(json.dumps({"sha256": hashing.sha256_file(path), "updates": updates}))
"""


def test_a_file_that_shrinks_while_hashed_does_not_kill_the_process(tmp_path: Path) -> None:
    chunks = 8
    result = subprocess.run(
        [sys.executable, "-c", SHRINK_WHILE_HASHING, str(tmp_path / "landing.jsonl"), str(chunks)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"hashing process died with {result.returncode}: {result.stderr[-2000:]}"
    hashed = json.loads(result.stdout)
    # The cut came after the first chunk was hashed, and the hash went on: it read again and
    # found the end of the (now empty) file, so only that first chunk is in the digest.
    assert hashed["updates"] == [[CHUNK_BYTES, 0]]
    assert hashed["sha256"] == hashlib.sha256(bytes(CHUNK_BYTES)).hexdigest()
    assert hashed["sha256"] != hashlib.sha256(bytes(chunks * CHUNK_BYTES)).hexdigest()


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

"""File hashing of files we do not own: read, never mapped, so a shrinking file cannot kill us."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from aieng_core.hashing import sha256_file
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

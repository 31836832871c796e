"""Where an artifact's bytes came from beyond its recipe: the code's commit and the versions
of the libraries that decide its content.

Both are recorded in every manifest for lineage, not folded into the artifact id: an id
changes with what we control (inputs, config, code version), and a library upgrade that does
change bytes shows up here, beside the commit, when someone asks why two runs differ.
"""

from __future__ import annotations

import platform
import subprocess
from functools import lru_cache
from importlib import metadata
from pathlib import Path

# The distributions whose code decides artifact bytes: kernels and init (torch), model and
# tokenizer files (transformers, tokenizers, safetensors), tables (pyarrow, numpy), cleaning
# and validation (pydantic), orchestration of the run (dagster).
LIBRARIES = ("torch", "transformers", "tokenizers", "safetensors", "pyarrow", "numpy", "pydantic", "dagster")


@lru_cache(maxsize=1)
def library_versions() -> dict[str, str | None]:
    """Installed version of each library in LIBRARIES (None if absent), and Python's.

    Read from package metadata, so nothing is imported: the core never imports dagster.
    """
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


@lru_cache(maxsize=1)
def git_commit() -> str | None:
    """The checkout's commit, if the code runs from one; recorded for lineage."""
    try:
        result = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = result.stdout.strip()
    if result.returncode != 0 or not commit:
        return None
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        cwd=Path(__file__).resolve().parent,
        capture_output=True,
        text=True,
        timeout=5,
        check=False,
    ).stdout.strip()
    return f"{commit}-dirty" if dirty else commit

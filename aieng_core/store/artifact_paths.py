"""What may name a path in the store, and how an artifact directory is walked: names checked as
text before any path is built from them (ids come from ref files and manifests anyone can edit
by hand), and trees walked without following a symbolic link."""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class ArtifactNotFound(LookupError):
    pass


class InvalidArtifactName(ArtifactNotFound, ValueError):
    """A kind, artifact id or partition that may not be used as a path component."""


# Kinds, ids and partitions become path components, and ids come from ref files and
# manifests that anyone can edit by hand: only plain names, so none can leave the store.
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def validate_name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not is_valid_name(value):
        raise InvalidArtifactName(
            f"invalid {what} {value!r}: expected letters, digits, '.', '_' or '-' (no '..'), at most 128"
        )
    return value


def is_valid_name(value: str) -> bool:
    return bool(NAME_PATTERN.fullmatch(value)) and ".." not in value


def file_key_problem(key: Any) -> str | None:
    """Why a manifest `files` key is not a plain relative path inside the artifact, or None.

    Keys are checked as text before any path is built from them, so a hand-edited manifest
    cannot make verify() read (or hash) anything outside the artifact directory.
    """
    if not isinstance(key, str) or not key:
        return "is not a non-empty string"
    if "\x00" in key or "\\" in key:
        return "contains a NUL or a backslash"
    if key.startswith("/"):
        return "is an absolute path"
    if any(part in ("", ".", "..") for part in key.split("/")):
        return "has an empty, '.' or '..' component"
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid UTF-8"
    return None


def listed_file_problem(root: Path, key: str) -> str | None:
    """Why the listed (well-formed) key is not a regular file reached without links, or None."""
    path = root
    for part in key.split("/"):
        path = path / part
        try:
            info = path.lstat()
        except FileNotFoundError:
            return "is missing"
        except OSError as exc:
            return f"cannot be examined ({exc.strerror})"
        if stat.S_ISLNK(info.st_mode):
            return "goes through a symbolic link"
    if not stat.S_ISREG(info.st_mode):
        return "is not a regular file"
    return None


def walk_tree(root: Path) -> Iterator[tuple[str, Path, os.stat_result]]:
    """(relative posix path, path, lstat) of every entry under root, never following a
    symbolic link (os.walk lists a linked directory but does not descend into it)."""
    for directory, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            path = Path(directory) / name
            yield path.relative_to(root).as_posix(), path, path.lstat()

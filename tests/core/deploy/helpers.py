"""Helpers of the deploy tests: a pointer's files as bytes, one byte changed, `aieng` run in
this process."""

from __future__ import annotations

from pathlib import Path

import pytest

from aieng_core.cli import main


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file of a pointer's directory, by name (the lock file aside)."""
    if not directory.is_dir():
        return {}
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir()) if path.name != ".lock"}


def flip_one_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def aieng(capsys: pytest.CaptureFixture[str], home: Path, *argv: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `aieng --home HOME ARGV...`."""
    capsys.readouterr()
    code = main(["--home", str(home), *argv])
    out, err = capsys.readouterr()
    return code, out, err

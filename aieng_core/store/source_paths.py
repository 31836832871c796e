"""How a landed file's path is written into a manifest as text: valid UTF-8 that still says
exactly which bytes the name was. raw_documents records its sources with it, and lineage
matches a path a user gives against those records with it, so both sit on this one rule."""

from __future__ import annotations

import os
import re

# Python hands back each byte of a name that is not valid UTF-8 as a lone surrogate
# U+DC80..U+DCFF (the "surrogateescape" error handler).
ESCAPED_BYTE = re.compile("[\udc80-\udcff]")


def readable(name: str | os.PathLike) -> str:
    """A file name or path as valid UTF-8 text that still says exactly which bytes it was:
    a backslash is written as two backslashes and each byte that is not valid UTF-8 as
    \\xNN. Names that are valid UTF-8 and hold no backslash come out unchanged."""
    text = os.fsencode(name).decode("utf-8", "surrogateescape")
    return ESCAPED_BYTE.sub(lambda m: f"\\x{ord(m.group()) - 0xDC00:02x}", text.replace("\\", "\\\\"))

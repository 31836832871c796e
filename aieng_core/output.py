"""How every `aieng` command prints its result: with --json, one JSON document on stdout;
otherwise the human rendering."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any


def emit(value: Any, as_json: bool, human: Callable[[Any], str]) -> None:
    if as_json:
        json.dump(value, sys.stdout, indent=2, sort_keys=True, ensure_ascii=False)
        sys.stdout.write("\n")
    else:
        print(human(value))

"""How every `aieng` command prints its result: with --json, one JSON document on stdout;
otherwise the human rendering. A benchmark also writes its results to `--out FILE`."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def emit(value: Any, as_json: bool, human: Callable[[Any], str]) -> None:
    if as_json:
        json.dump(value, sys.stdout, indent=2, sort_keys=True, ensure_ascii=False)
        sys.stdout.write("\n")
    else:
        print(human(value))


def write_results(out: str | None, results: Any) -> None:
    """The benchmarks' `--out FILE`: the results as one JSON document (nothing without `out`)."""
    if out:
        path = Path(out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n", encoding="utf-8")

"""Render the reference pages of the documentation from the code, so they cannot drift from it.

    python scripts/docs_reference.py           # write docs/reference/{configuration,cli,metrics}.md
    python scripts/docs_reference.py --check   # compare only; exit 1 naming each stale page

- configuration.md: the pydantic models of the config (`AiengConfig` and each section model):
  per section, every key with its type, default, constraints and description.
- cli.md: the argparse parser of `aieng` (`build_parser()`): every command and subcommand, its
  usage line, help and options.
- metrics.md: the Prometheus metrics of `aieng serve`: `METRIC_HELP` and the registry of a
  constructed `ServingMetrics()`.

`tests/test_docs.py` fails when a committed page differs from what this renders now. The
output depends on nothing but the code: a fixed program name and width for usage lines, no
environment, no time.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

# The renderers live beside this script (scripts/reference_pages/), whether it is run or imported.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from reference_pages.cli import render_cli  # noqa: E402
from reference_pages.configuration import render_configuration  # noqa: E402
from reference_pages.markdown import REFERENCE_DIR, REGENERATE, REPO_ROOT  # noqa: E402
from reference_pages.metrics import render_metrics  # noqa: E402

PAGES: dict[str, Callable[[], str]] = {
    "configuration.md": render_configuration,
    "cli.md": render_cli,
    "metrics.md": render_metrics,
}


def render_all() -> dict[Path, str]:
    """Each generated page's path and the text it must hold."""
    return {REFERENCE_DIR / name: render() for name, render in PAGES.items()}


def stale_pages(rendered: dict[Path, str] | None = None) -> list[Path]:
    """The generated pages whose file differs from what the code renders now (or is missing)."""
    rendered = render_all() if rendered is None else rendered
    stale = []
    for path, text in rendered.items():
        try:
            current = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            current = None
        if current != text:
            stale.append(path)
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="docs_reference.py", description="Render docs/reference/*.md from the code (config, CLI, metrics)."
    )
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 naming each stale page")
    args = parser.parse_args(argv)
    rendered = render_all()
    stale = stale_pages(rendered)
    if args.check:
        for path in stale:
            print(f"{path.relative_to(REPO_ROOT)} is stale: run `{REGENERATE}`", file=sys.stderr)
        return 1 if stale else 0
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(rendered[path], encoding="utf-8")
        print(f"wrote {path.relative_to(REPO_ROOT)}")
    if not stale:
        print("docs/reference is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())

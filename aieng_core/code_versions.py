"""Code versions tied to the code: each stage's CODE_VERSION is locked to a hash of the
source that decides its content (the stage module's import closure, less a reviewed list of
modules that decide no byte), and a test fails when that source changes while the version
does not.

Why a lock rather than a version derived from the source hash: a derived version changes on
every edit that changes the code at all, retraining the model for a renamed variable; a
lock keeps versions readable and bumped on purpose, and the test makes forgetting the bump
impossible. The hash is over each module's syntax tree without docstrings, so comments,
docstrings and reformatting never call for a bump.

`code_versions.json` beside this file keeps, per stage, every version ever locked with the
source hashes it names; a locked hash is never taken away. After a deliberate change of a
stage's behaviour: bump its CODE_VERSION, then run `python -m aieng_core.code_versions --lock`.
After a change that provably keeps every byte the stage writes (an import moved, a name
renamed, an annotation modernised): `--lock --same-behaviour` adds the new hash to the
version it already has. That is a claim a reviewer checks in the lock file's diff; when in
doubt, bump.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import json
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
LOCK_FILE = PACKAGE / "code_versions.json"

# Each stage: the module that builds it (its CODE_VERSION lives there). What decides its bytes
# is that module's import closure: every module of aieng_core it imports, at module level or
# inside a function, and theirs in turn, found by reading the source (never by importing it),
# so a module a stage reaches is never missing from its hash.
STAGES: dict[str, str] = {
    "raw_documents": "aieng_core.data.raw_documents",
    "clean_documents": "aieng_core.data.clean_documents",
    "bpe_tokenizer": "aieng_core.tokenizer.bpe_tokenizer",
    "tokenized_documents": "aieng_core.tokenizer.tokenized_documents",
    "dataset_manifest": "aieng_core.dataset.dataset_manifest",
    "model_checkpoint": "aieng_core.training.model_checkpoint",
    "benchmark_report": "aieng_core.benchmark.benchmark_report",
    "serving_bundle": "aieng_core.bundle.serving_bundle",
    # The int8 variant's own builder (bundle.weights: int8), versioned in its recipe.
    "serving_bundle_int8": "aieng_core.bundle.int8_variant",
    "production_deployment": "aieng_core.gate.production_deployment",
}

# Modules in the closures that decide no byte any stage writes, each with the reason; the
# closure does not go through them. Reviewed: adding one here is a claim, like --same-behaviour.
EXCLUDED: dict[str, str] = {
    "config/__init__.py": "loads and checks the YAML; the values a stage reads are hashed into its id by section",
    "config/pipeline_sections.py": "the sections' schema: their values are hashed into ids, not their code",
    "config/serving_sections.py": "the sections' schema: their values are hashed into ids, not their code",
    "store/__init__.py": "re-exports store/artifacts.py",
    "store/artifacts.py": "the store: places and names what a stage produced; ids hash each stage's recipe "
    "(ArtifactSpec), so a change here changes every id at once and is reviewed as such",
    "store/atomic.py": "how bytes reach the disk (staged, fsynced, renamed), not which bytes",
    "store/file_lock.py": "who may write at a time, not what is written",
    "store/provenance.py": "git commit and run id in the manifest: provenance, outside every content hash",
    "faults.py": "crash points for the crash tests: no-ops unless AIENG_CRASH_AT arms one",
    "progress.py": "progress lines in the log",
    "home.py": "where $AIENG_HOME and its landing folders are",
}


def _module_file(package: Path, module: str) -> Path | None:
    """The file of `aieng_core.x.y` under `package` (aieng_core/), or None if there is none."""
    parts = module.split(".")[1:]
    base = package.joinpath(*parts) if parts else package
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported_modules(tree: ast.AST) -> set[str]:
    """Every aieng_core module a syntax tree imports when it runs, function-level imports
    included, `if TYPE_CHECKING:` blocks (never run) left out. `from a.b import c` names a.b,
    and a.b.c too in case c is a module (the caller keeps those that exist)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for branch in node.orelse:
                visit(branch)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return {name for name in found if name == "aieng_core" or name.startswith("aieng_core.")}


def stage_sources(stage: str, package: Path | None = None) -> list[str]:
    """The files (relative to aieng_core/) of a stage's import closure, sorted: the stage's
    module, the packages above each module (their __init__ runs too), and everything they
    import, less EXCLUDED."""
    package = package or PACKAGE
    pending, seen = [STAGES[stage]], set()
    files: set[str] = set()
    while pending:
        module = pending.pop()
        if module in seen:
            continue
        seen.add(module)
        path = _module_file(package, module)
        if path is None:
            continue  # `from package import name` where name is not a module
        relative = path.relative_to(package).as_posix()
        if relative in EXCLUDED:
            continue
        files.add(relative)
        parents = module.split(".")
        pending += [".".join(parents[:n]) for n in range(2, len(parents))]
        pending += sorted(imported_modules(ast.parse(path.read_text(encoding="utf-8"))))
    return sorted(files)


def _without_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                node.body = node.body[1:] or [ast.Pass()]
    return tree


def source_sha256(stage: str) -> str:
    """Hash of the code (syntax trees, docstrings dropped) of a stage's import closure."""
    digest = hashlib.sha256()
    for relative in stage_sources(stage):
        tree = _without_docstrings(ast.parse((PACKAGE / relative).read_text(encoding="utf-8")))
        digest.update(relative.encode() + b"\0" + ast.dump(tree, include_attributes=False).encode() + b"\0")
    return digest.hexdigest()


def current_versions() -> dict[str, str]:
    return {stage: importlib.import_module(module).CODE_VERSION for stage, module in STAGES.items()}


def read_lock() -> dict[str, dict[str, list[str]]]:
    """stage -> version -> the source hashes locked to it (the first one, then same-behaviour edits)."""
    return json.loads(LOCK_FILE.read_text(encoding="utf-8")) if LOCK_FILE.exists() else {}


def problems() -> list[str]:
    """What is out of step between the code, its versions and the lock."""
    lock, found = read_lock(), []
    for stage, version in current_versions().items():
        locked = lock.get(stage, {}).get(version)
        source = source_sha256(stage)
        if not locked:
            found.append(
                f"{stage}: {version} is not in {LOCK_FILE.name}; run `python -m aieng_core.code_versions --lock`"
            )
        elif source not in locked:
            found.append(
                f"{stage}: its source changed but CODE_VERSION is still {version!r}; bump it (the artifacts it made "
                f"no longer match its code), then run `python -m aieng_core.code_versions --lock` (or, for an edit "
                f"that keeps every byte the stage writes, `--lock --same-behaviour`)"
            )
    return found


def lock(same_behaviour: bool = False) -> list[str]:
    """Record the current versions. A locked version gets another source hash only with
    same_behaviour=True (the caller's claim that the stage writes the same bytes)."""
    refused = [problem for problem in problems() if "source changed" in problem]
    if refused and not same_behaviour:
        return refused
    entries = read_lock()
    for stage, version in current_versions().items():
        hashes = entries.setdefault(stage, {}).setdefault(version, [])
        if source_sha256(stage) not in hashes:
            hashes.append(source_sha256(stage))
    LOCK_FILE.write_text(json.dumps(entries, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return []


if __name__ == "__main__":
    arguments = sys.argv[1:]
    found = lock(same_behaviour="--same-behaviour" in arguments) if "--lock" in arguments else problems()
    for problem in found:
        print(problem, file=sys.stderr)
    sys.exit(1 if found else 0)

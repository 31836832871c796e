"""The layer order of aieng_core, declared once in docs/architecture.md, holds for every import.

Every import in aieng_core is read from the source (module level, inside functions, under
`if TYPE_CHECKING:`): an import may only reach a node of a lower layer. A node is a package
of aieng_core (a directory), a nested package the table names (serving.http), or a top-level
module. An import that points up a layer or sideways (another node of the same layer) fails
with its file and line; so does a node the table does not place. With every import pointing
down, no cycle between nodes is possible.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGE = REPO_ROOT / "aieng_core"
ARCHITECTURE = REPO_ROOT / "docs" / "architecture.md"
MARKER = "<!-- layer-order:"


def declared_layers(text: str) -> list[list[str]]:
    """The table after the layer-order marker, bottom layer first: each line names its nodes,
    comma-separated, then (two or more spaces on) what the layer is."""
    after = text[text.index(MARKER) :]
    block = re.search(r"```text\n(.*?)\n```", after, re.DOTALL)
    assert block is not None, f"{ARCHITECTURE}: no ```text block after {MARKER}"
    layers = []
    for line in block.group(1).splitlines():
        names = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
        layers.append([name.strip() for name in names.split(",")])
    return layers[::-1]


@dataclass(frozen=True)
class Import:
    source: str  # file, relative to the repository
    line: int
    module: str  # aieng_core.x.y


def imports_of(path: Path, root: Path) -> list[Import]:
    found = []
    relative = str(path.relative_to(root))
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [Import(relative, node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{relative}:{node.lineno}: a relative import (write it absolute)"
            module = node.module or ""
            found.append(Import(relative, node.lineno, module))
            # `from aieng_core import asset_keys`, `from aieng_core.serving import http`: the
            # names may be modules, and those are what is imported.
            found += [Import(relative, node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return [item for item in found if item.module.split(".")[0] == "aieng_core"]


class Nodes:
    def __init__(self, layers: list[list[str]], package: Path) -> None:
        self.package = package
        self.layer = {name: index for index, nodes in enumerate(layers) for name in nodes}
        self.nested = sorted((name for name in self.layer if "." in name), key=len, reverse=True)

    def of(self, module: str) -> str | None:
        """The node of `aieng_core.x.y...`; None for `aieng_core` itself or a name that is no module."""
        parts = module.split(".")[1:]
        if not parts:
            return None
        dotted = ".".join(parts)
        for name in self.nested:
            if dotted == name or dotted.startswith(name + "."):
                return name
        base = self.package.joinpath(*parts)
        if not (base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()):
            # `from aieng_core.store import Artifact`: the name is no module; the node is its package's.
            return self.of(module.rsplit(".", 1)[0]) if len(parts) > 1 else None
        return parts[0]


def module_of(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def violations(layers: list[list[str]], package: Path = PACKAGE) -> tuple[list[str], list[str]]:
    """(imports that point up or sideways, nodes the table does not place) in `package`."""
    nodes, root = Nodes(layers, package), package.parent
    wrong, unplaced = [], set()
    for path in sorted(package.rglob("*.py")):
        source = nodes.of(module_of(path, root))
        if source is None:
            continue
        if source not in nodes.layer:
            unplaced.add(source)
            continue
        seen = set()
        for item in imports_of(path, root):
            target = nodes.of(item.module)
            if target is None or target == source or (item.line, target) in seen:
                continue
            seen.add((item.line, target))  # `from a.b import c, d`: one import of one node
            if target not in nodes.layer:
                unplaced.add(target)
            elif nodes.layer[target] >= nodes.layer[source]:
                how = "sideways, within its layer" if nodes.layer[target] == nodes.layer[source] else "up a layer"
                wrong.append(f"{item.source}:{item.line}: {source} imports {item.module} ({target}): {how}")
    return wrong, sorted(unplaced)


def test_every_import_points_down_the_declared_layers() -> None:
    wrong, unplaced = violations(declared_layers(ARCHITECTURE.read_text(encoding="utf-8")))
    assert unplaced == [], f"not in the layer table of {ARCHITECTURE.relative_to(REPO_ROOT)}: {unplaced}"
    assert wrong == [], "\n".join(wrong)


def test_each_node_is_placed_once() -> None:
    names = [name for layer in declared_layers(ARCHITECTURE.read_text(encoding="utf-8")) for name in layer]
    assert len(names) == len(set(names)), sorted(name for name in names if names.count(name) > 1)


@pytest.mark.parametrize(
    ("layers", "expected"),
    [
        # store is below lineage's readers: a store module that imports deploy points up.
        ([["store"], ["deploy"]], "up a layer"),
        # two nodes of one layer import each other: sideways.
        ([["store", "deploy"]], "sideways, within its layer"),
    ],
)
def test_the_check_catches_an_import_up_or_sideways(layers: list[list[str]], expected: str, tmp_path: Path) -> None:
    """The rule itself, on a tree of two packages where store imports deploy inside a function
    (the circle issue 17 found: store/lineage.py importing deploy/deployments.py)."""
    root = tmp_path / "repo"
    for package in ("store", "deploy"):
        (root / "aieng_core" / package).mkdir(parents=True)
        (root / "aieng_core" / package / "__init__.py").write_text("")
    (root / "aieng_core" / "__init__.py").write_text("")
    (root / "aieng_core" / "store" / "lineage.py").write_text(
        "def deployed():\n    from aieng_core.deploy.deployments import Deployments\n"
    )
    (root / "aieng_core" / "deploy" / "deployments.py").write_text("from aieng_core.store import lineage\n")
    wrong, unplaced = violations(layers, root / "aieng_core")
    assert unplaced == []
    assert any(line.startswith("aieng_core/store/lineage.py:2: store imports") and expected in line for line in wrong)

"""The demo data: reproducible bytes, and each day independent of how many days are landed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from aieng_core.data.demo_data import land_demo_data
from tests.conftest import REPO_ROOT


def landed_bytes(home: Path) -> dict[str, bytes]:
    return {p.relative_to(home).as_posix(): p.read_bytes() for p in sorted((home / "raw").rglob("*")) if p.is_file()}


def test_a_day_holds_the_same_bytes_whatever_the_number_of_days(tmp_path: Path) -> None:
    land_demo_data(tmp_path / "one", days=1)
    land_demo_data(tmp_path / "four", days=4)
    one, four = landed_bytes(tmp_path / "one"), landed_bytes(tmp_path / "four")
    assert one == {k: v for k, v in four.items() if k.startswith("raw/2026-01-01/")}
    assert len({k.split("/")[1] for k in four}) == 4


def test_demo_bytes_do_not_depend_on_the_calling_process(tmp_path: Path) -> None:
    """The module docstring promises byte-identical files for a given Python version.

    The corpus is built from live objects' docstrings, so anything the calling process has
    monkeypatched (pytest replaces threading.excepthook, for one) leaks into the data and
    changes the data version. A fresh interpreter must land exactly what this one lands.
    """
    land_demo_data(tmp_path / "here")
    script = (
        "import sys; from pathlib import Path; from aieng_core.data.demo_data import land_demo_data; "
        "land_demo_data(Path(sys.argv[1]))"
    )
    subprocess.run([sys.executable, "-c", script, str(tmp_path / "fresh")], cwd=REPO_ROOT, check=True, timeout=120)
    here, fresh = landed_bytes(tmp_path / "here"), landed_bytes(tmp_path / "fresh")
    assert sorted(here) == sorted(fresh)
    assert [name for name in sorted(here) if here[name] != fresh[name]] == []

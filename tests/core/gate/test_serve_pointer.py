"""`aieng serve --pointer NAME`: the drill's server follows a pointer of its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from aieng_core import cli


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--bundle", "some/bundle", "--pointer", "drill"], "use it with --deployment current"),
        (["--deployment", "current", "--pointer", "../production"], "deployment pointer"),
    ],
)
def test_pointer_refusals(arguments: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["serve", *arguments]) == 1
    error = capsys.readouterr().err
    assert error.startswith("aieng: error: ") and message in error


def test_the_pointer_reaches_the_server(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: dict[str, object] = {}

    def fake_run_server(**kwargs: object) -> int:
        seen.update(kwargs)
        return 0

    monkeypatch.setattr("aieng_core.serving.http.server.run_server", fake_run_server)
    assert cli.main(["--home", str(tmp_path), "serve", "--deployment", "current", "--pointer", "drill"]) == 0
    assert (seen["pointer"], seen["follow_home"], seen["bundle_path"]) == ("drill", tmp_path.resolve(), None)
    assert cli.main(["--home", str(tmp_path), "serve", "--deployment", "current"]) == 0
    assert seen["pointer"] == "production"

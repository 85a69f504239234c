"""`python -m loraplex.platform.db.migrate`: what the Kubernetes migration Job runs."""

from __future__ import annotations

import pytest

from loraplex.platform.db.migrate import current_revision, main


def test_upgrade_and_downgrade_from_the_environment(
    empty_db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LORAPLEX_DATABASE_URL", empty_db_url)
    assert main(["upgrade", "head"]) == 0
    head = current_revision(empty_db_url)
    assert head is not None and f"database at {head}" in capsys.readouterr().out
    with pytest.raises(SystemExit) as refused:
        main(["downgrade"])
    assert refused.value.code == 2 and "needs the revision" in capsys.readouterr().err
    assert main(["downgrade", "base"]) == 0
    assert current_revision(empty_db_url) is None
    monkeypatch.delenv("LORAPLEX_DATABASE_URL")
    with pytest.raises(SystemExit):
        main([])

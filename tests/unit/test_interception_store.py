"""The interception CA survives a control restart when it has a directory; its key stays private."""

from __future__ import annotations

import stat
from pathlib import Path

from supervisor.control.interception import CERT_FILE, KEY_FILE, load_or_create


def test_created_once_then_reloaded(tmp_path: Path) -> None:
    first = load_or_create(tmp_path / "ca", "sandbox-a")
    assert stat.S_IMODE((tmp_path / "ca" / KEY_FILE).stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "ca").stat().st_mode) == 0o700
    again = load_or_create(tmp_path / "ca", "sandbox-a")
    assert again.cert_pem == first.cert_pem == (tmp_path / "ca" / CERT_FILE).read_text()


def test_without_a_directory_each_control_mints_its_own(tmp_path: Path) -> None:
    assert load_or_create(None, "s").cert_pem != load_or_create(None, "s").cert_pem

"""What dev mode hands the daemons so the agent never touches its policy or control's secrets (no daemon runs)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from supervisor.cli.dev_confinement import PRIVATE_DIR, DevConfinement, DevSetupError, parse_agent_user, prepare

POLICY = "version: 1\nnetwork_policies: {}\n"


def _prepare(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model: str, **kw: object) -> DevConfinement:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    (tmp_path / "dev").mkdir(mode=0o700)
    (tmp_path / "run").mkdir()
    policy, credentials = tmp_path / "policy.yaml", tmp_path / "credentials.yaml"
    policy.write_text(POLICY)
    credentials.write_text("T:\n  secret: s3cret\n  hosts: [a.example.com]\n")
    args: dict[str, object] = {"sandbox": "dev-test", "tmp": tmp_path / "dev", "runtime_parent": tmp_path / "run",
                               "model": model, "workdir": None, "agent_user": None, "policy": policy,
                               "credentials": credentials}  # fmt: skip
    args.update(kw)
    return prepare(**args)  # type: ignore[arg-type]


def _flag(flags: list[str], name: str) -> list[str]:
    return [f.split("=", 1)[1] for f in flags if f.startswith(name + "=")]


def test_control_works_from_private_copies_and_the_originals_are_hidden(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = _prepare(tmp_path, monkeypatch, "U")
    private = tmp_path / "dev" / PRIVATE_DIR
    assert stat.S_IMODE(private.stat().st_mode) == 0o700
    (copy,) = _flag(plan.control_flags, "--policy")
    (creds,) = _flag(plan.control_flags, "--credentials")
    assert Path(copy).parent == private and Path(creds).parent == private
    assert Path(copy).read_text() == POLICY and stat.S_IMODE(Path(creds).stat().st_mode) == 0o600
    assert _flag(plan.control_flags, "--policy-source") == [str(tmp_path / "policy.yaml")]
    hidden = _flag(plan.boundary_flags, "--hide-path")
    for path in (tmp_path / "policy.yaml", tmp_path / "credentials.yaml", tmp_path / "dev", private,
                 tmp_path / "run", tmp_path / "dev" / "interception"):  # fmt: skip
        assert str(path) in hidden
    assert any(h.endswith("events.jsonl") for h in hidden)
    assert "--no-policy-watch" not in plan.control_flags
    # under /tmp (pytest's tmp_path): the agent's, so dev says the file is loaded once
    assert any("loaded once" in note for note in plan.notes)


def test_default_workdir_is_the_agents_and_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = _prepare(tmp_path, monkeypatch, "R" if os.geteuid() == 0 else "U")
    work = tmp_path / "state" / "openshell-sandbox" / "dev-test" / "work"
    assert plan.workdir == work and work.is_dir()
    expected = plan.agent[0] if plan.agent is not None else os.geteuid()
    assert work.stat().st_uid == expected and stat.S_IMODE(work.stat().st_mode) == 0o700
    assert f"--workdir={work}" in plan.boundary_flags
    assert f"--agent-writable={work}" in plan.control_flags
    if os.geteuid() == 0:
        assert plan.agent is not None and plan.agent[0] >= 61000
        assert f"--agent-user={plan.agent[0]}:{plan.agent[1]}" in plan.control_flags


def test_model_p_is_said_unprotected_and_never_watched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = _prepare(tmp_path, monkeypatch, "P")
    assert "--no-policy-watch" in plan.control_flags
    assert any("secrets are NOT protected" in note for note in plan.notes)
    assert plan.agent is None


@pytest.mark.skipif(os.geteuid() != 0, reason="--agent-user applies as root")
@pytest.mark.parametrize("text", ["0:0", "61001:0", "x", "-1:5"])
def test_agent_user_never_root_or_malformed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    with pytest.raises(DevSetupError, match="--agent-user"):
        _prepare(tmp_path, monkeypatch, "R", agent_user=text)


def test_parse_agent_user() -> None:
    assert parse_agent_user("61001") == (61001, 61001)
    assert parse_agent_user("61001:61002") == (61001, 61002)

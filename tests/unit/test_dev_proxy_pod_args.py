"""``dev --topology proxy-pod --proxy-max-connections N``: how dev hands the cap to control, and the
usage errors that refuse it before anything is started."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.cli.daemon_args import daemon_parser
from supervisor.cli.dev_common import DevOptions
from supervisor.cli.dev_proxy_pod import control_command
from supervisor.cli.main import command_parser, main
from supervisor.protocol.exit_codes import ExitCode
from supervisor.protocol.interpreter import cli_argv


def _control_args(tmp_path: Path, cap: int | None) -> list[str]:
    opts = DevOptions(argv=["true"], topology="proxy-pod", proxy_max_connections=cap)
    cmd = control_command(opts, tmp=tmp_path, control_ip="169.254.20.1", token_file=tmp_path / "token",
                          api=tmp_path / "api.sock", log_file=tmp_path / "events.jsonl")  # fmt: skip
    prefix = cli_argv()
    assert cmd[: len(prefix)] == prefix and cmd[1:3] == ["-I", "-S"], "control runs isolated"
    return cmd[len(prefix) :]


def test_the_cap_sets_both_of_controls_limits(tmp_path: Path) -> None:
    args = daemon_parser().parse_args(_control_args(tmp_path, 20000))
    assert (args.proxy_max_connections, args.proxy_per_client) == (20000, 20000)
    assert args.topology == "proxy-pod" and args.proxy_listen == "169.254.20.1:3128"


def test_without_the_cap_control_keeps_its_defaults(tmp_path: Path) -> None:
    argv = _control_args(tmp_path, None)
    assert not any(a.startswith(("--proxy-max-connections", "--proxy-per-client")) for a in argv)
    parser = daemon_parser()
    args = parser.parse_args(argv)
    assert args.proxy_max_connections == parser.get_default("proxy_max_connections") == 1024
    assert args.proxy_per_client == parser.get_default("proxy_per_client") == 1024


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--proxy-max-connections=5"], "only with --topology proxy-pod"),
        (["--topology=boundary", "--proxy-max-connections", "5"], "only with --topology proxy-pod"),
        (["--topology=proxy-pod", "--proxy-max-connections=0"], "must be at least 1, got 0"),
        (["--topology=proxy-pod", "--proxy-max-connections=-3"], "must be at least 1, got -3"),
    ],
)
def test_refused_before_anything_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    assert main(["dev", *argv, "--", "true"]) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "dev --proxy-max-connections" in err and message in err, err
    assert not (tmp_path / "state").exists() and not (tmp_path / "run").exists()  # no sandbox was made


def test_help_explains_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        command_parser().parse_args(["dev", "--help"])
    assert exited.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--proxy-max-connections N" in text and "proxy-pod only" in text and "default control's, 1024" in text


def test_the_agent_gets_the_boundary_topologys_ca_variables(tmp_path: Path) -> None:
    """docs/policy.md "Tools in the agent": the same variables as the boundary topology, the bundle where they
    replace a tool's store (npm and pip included), the CA alone where they add to it."""
    from supervisor.cli.dev_proxy_pod import _agent_env

    env = _agent_env("http://sandbox:t@10.0.0.1:3128", tmp_path / "bundle.pem", tmp_path / "ca.pem", "/work")
    for key in ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO", "PIP_CERT",
                "npm_config_cafile"):  # fmt: skip
        assert env[key] == str(tmp_path / "bundle.pem"), key
    assert env["NODE_EXTRA_CA_CERTS"] == env["DENO_CERT"] == str(tmp_path / "ca.pem")

"""Dev mode talks to a person: human lines on stderr, JSON in the events file, ``logs -f`` from elsewhere.

Every refused connection here is the agent dialling a TEST-NET address from its own network namespace, which
holds only loopback: the connection lands on the boundary, control refuses it (deny-all policy) and nothing
leaves the machine.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.sandbox_api import api_env

CLI = [sys.executable, "-m", "supervisor.cli"]
REFUSED_URL = "http://198.51.100.7:8080/refused-by-policy"
PREFIX = "openshell-sandbox: "


@pytest.fixture
def env() -> Iterator[dict[str, str]]:
    """A private runtime dir (the API socket; short path) and state dir (the events file) per test."""
    runtime = tempfile.mkdtemp(prefix="osr-", dir="/tmp")
    state = tempfile.mkdtemp(prefix="oss-", dir="/tmp")
    yield {**os.environ, "XDG_RUNTIME_DIR": runtime, "XDG_STATE_HOME": state}
    shutil.rmtree(runtime, ignore_errors=True)
    shutil.rmtree(state, ignore_errors=True)


def dev(env: dict[str, str], *options: str, script: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "dev", *options, "--", "sh", "-c", script], capture_output=True, text=True, timeout=timeout, env=env
    )


def events_file(env: dict[str, str]) -> Path:
    found = list(Path(env["XDG_STATE_HOME"], "openshell-sandbox").glob("dev-*/events.jsonl"))
    assert len(found) == 1, found
    return found[0]


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_dev_mode_stderr_is_for_a_person_and_the_events_file_keeps_the_json(env: dict[str, str]) -> None:
    result = dev(env, script=f"echo agent-out; curl -s -m 10 -o /dev/null {REFUSED_URL}; echo agent-err >&2")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "agent-out\n"
    assert "agent-err\n" in result.stderr
    assert not any(line.lstrip().startswith("{") for line in result.stderr.splitlines()), result.stderr
    ours = [line for line in result.stderr.splitlines() if line.startswith(PREFIX)]
    assert len(ours) <= 6, ours  # a few lines, not a log

    path = events_file(env)
    sandbox = path.parent.name
    ready = [line for line in ours if " is ready " in line]
    assert len(ready) == 1, ours
    for part in (sandbox, "policy embedded deny-all (generation 0)", "fence netns", "model R",
                 "openshell-sandbox exec -it -- sh", str(path)):  # fmt: skip
        assert part in ready[0], ready[0]
    refused = [line for line in ours if " DENIED " in line]
    assert len(refused) == 1, ours
    assert " NET:OPEN [MED] DENIED curl(" in refused[0], refused[0]
    assert ") -> 198.51.100.7:8080 [reason:no-network-policies] (why: " in refused[0], refused[0]
    assert "policy decide --policy " in refused[0] and "--host 198.51.100.7 --port 8080" in refused[0]

    # the JSON went to the file, kept after exit, readable by us only
    assert path.stat().st_mode & 0o777 == 0o600
    events = json_lines(path.read_text())
    assert {e["component"] for e in events} == {"control", "boundary"}
    denied = [e for e in events if e["event"] == "egress" and e.get("decision") == "deny"]
    assert [e["destination"] for e in denied] == ["198.51.100.7:8080"]
    assert all(e["sandbox"] == sandbox for e in events)


def test_the_refusal_line_explains_itself(env: dict[str, str]) -> None:
    result = dev(env, script=f"curl -s -m 10 -o /dev/null {REFUSED_URL}")
    line = next(line for line in result.stderr.splitlines() if " DENIED " in line)
    command = line.split("(why: ", 1)[1].rstrip(")")
    argv = command.split()
    assert argv[:3] == ["openshell-sandbox", "policy", "decide"]
    explained = subprocess.run([*CLI, *argv[1:]], capture_output=True, text=True, timeout=60, env=env)
    assert explained.returncode == 1, explained.stdout + explained.stderr  # 1: denied, as the sandbox decided
    assert "no-network-policies" in explained.stdout + explained.stderr


def test_log_format_json_streams_the_events_to_stderr(env: dict[str, str]) -> None:
    result = dev(env, "--log-format=json", script=f"curl -s -m 10 -o /dev/null {REFUSED_URL}")
    assert result.returncode == 0, result.stderr
    streamed = json_lines(result.stderr)
    assert any(e["event"] == "egress" and e.get("decision") == "deny" for e in streamed)
    assert not any(" is ready " in line for line in result.stderr.splitlines())
    assert len(json_lines(events_file(env).read_text())) == len(streamed)  # the file has them too


def test_quiet_prints_nothing_of_ours(env: dict[str, str]) -> None:
    result = dev(env, "-q", script=f"echo agent-out; curl -s -m 10 -o /dev/null {REFUSED_URL}; echo agent-err >&2")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "agent-out\n"
    assert result.stderr == "agent-err\n"
    assert any(e["event"] == "egress" for e in json_lines(events_file(env).read_text()))


def test_a_binary_name_cannot_write_escape_sequences_to_the_operators_terminal(env: dict[str, str]) -> None:
    """The agent names its own executable with a terminal escape and a newline, then connects with it."""
    script = (
        'evil="$PWD/$(printf \'cur\\033[2J\\033]0;owned\\007l\\nforged\')"; cp /usr/bin/curl "$evil" && '
        f'"$evil" -s -m 10 -o /dev/null {REFUSED_URL}; echo done'
    )
    result = dev(env, script=script)
    assert result.returncode == 0 and result.stdout == "done\n", result.stderr
    assert "\x1b" not in result.stderr and "\x07" not in result.stderr
    refused = [line for line in result.stderr.splitlines() if " DENIED " in line]
    assert len(refused) == 1, result.stderr
    assert "DENIED cur\\x1b[2J\\x1b]0;owned\\x07l\\nforged(" in refused[0]
    assert ") -> 198.51.100.7:8080 [reason:" in refused[0]
    assert not any(line.startswith("forged") for line in result.stderr.splitlines())


def _wait_for(predicate: Any, what: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_logs_follow_shows_a_running_sandboxs_refusals_from_another_process(env: dict[str, str]) -> None:
    # The agent dials once per line it reads on stdin; the second dial happens after the follower has printed
    # the first, so it can only have reached the follower by following.
    script = f"while read -r n; do curl -s -m 10 -o /dev/null {REFUSED_URL}/$n; done"
    sandbox = subprocess.Popen([*CLI, "dev", "--", "sh", "-c", script], env=env, text=True, stdin=subprocess.PIPE,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    assert sandbox.stdin is not None
    follower: subprocess.Popen[str] | None = None
    try:
        _wait_for(lambda: subprocess.run([*CLI, "readyz"], env=api_env(env), capture_output=True).returncode == 0,
                  "ready")  # fmt: skip
        follower = subprocess.Popen([*CLI, "logs", "-f", "--event", "egress"], env=api_env(env), text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
        assert follower.stdout is not None
        lines = []
        for n in (1, 2, 3):
            sandbox.stdin.write(f"{n}\n")
            sandbox.stdin.flush()
            lines.append(follower.stdout.readline())
        assert all(" control  NET:OPEN [MED] DENIED curl(" in x for x in lines), lines
        assert all(x.endswith(") -> 198.51.100.7:8080 [reason:no-network-policies]\n") for x in lines), lines
        tail = subprocess.run([*CLI, "logs", "-n", "2", "--json", "--event", "egress"], env=api_env(env),
                              capture_output=True, text=True, timeout=30)  # fmt: skip
        assert tail.returncode == 0, tail.stderr
        assert [e["decision"] for e in json_lines(tail.stdout)] == ["deny", "deny"]
        ocsf = subprocess.run([*CLI, "logs", "-n", "2", "--format", "ocsf", "--event", "egress"], env=api_env(env),
                              capture_output=True, text=True, timeout=30)  # fmt: skip
        assert ocsf.returncode == 0, ocsf.stderr
        objects = json_lines(ocsf.stdout)
        assert [(o["class_uid"], o["activity_id"], o["action_id"], o["disposition_id"]) for o in objects] == [
            (4001, 1, 2, 2)] * 2  # fmt: skip
        # the binary and the absolute paths among its arguments (curl's -o /dev/null), never the argv (its URL)
        assert {o["actor"]["process"]["cmd_line"] for o in objects} == {"/usr/bin/curl /dev/null"}
    finally:
        sandbox.stdin.close()  # the agent's loop ends: the sandbox stops
        sandbox.wait(timeout=60)
        if follower is not None:
            # control went away: the follower ends by itself, successfully
            assert follower.wait(timeout=30) == 0, follower.stderr.read() if follower.stderr else ""

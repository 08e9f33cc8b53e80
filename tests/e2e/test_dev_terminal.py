"""`dev -- bash` in a real terminal (tmux): the agent's own PTY, job control, Ctrl-C/Ctrl-Z/Ctrl-\\ for the agent's
programs, `tty`, `clear`, resize, the `~.` escape, dev's lines between the agent's lines, and nothing left behind.

The screen is read with ``tmux capture-pane`` and every step waits on what the screen (or /proc) shows."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.waiting import wait_until

pytestmark = [
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (scripts/install-test-deps.sh)"),
    pytest.mark.skipif(os.geteuid() != 0, reason="dev mode runs the boundary in model R here (root)"),
]
PROMPT = re.compile(r"^sandbox@[^ ]*\$ ?$")  # bash's prompt for the agent's account (rootfs.py rule 6)


class Tmux:
    """One tmux server of our own running ``dev -- CMD`` in a 100x30 window that stays after dev exits."""

    def __init__(self, *dev_args: str, cmd: str = "bash") -> None:
        self.server = f"ost-{uuid.uuid4().hex[:8]}"
        env = {name: os.environ[name] for name in ("XDG_RUNTIME_DIR", "XDG_STATE_HOME")}
        argv = ["env", "TERM=screen-256color", *(f"{k}={v}" for k, v in env.items()), sys.executable, "-m",
                "supervisor.cli", "dev", *dev_args, "--", *shlex.split(cmd)]  # fmt: skip
        self.status = Path(os.environ["XDG_RUNTIME_DIR"]) / f"{self.server}.status"
        shell = f"{shlex.join(argv)}; echo $? > {shlex.quote(str(self.status))}.tmp; mv {self.status}.tmp {self.status}"
        self.tmux("new-session", "-d", "-s", "t", "-x", "100", "-y", "30", shell, ";",
                  "set-option", "-t", "t", "remain-on-exit", "on")  # fmt: skip

    def tmux(self, *args: str) -> str:
        done = subprocess.run(["tmux", "-L", self.server, "-f", "/dev/null", *args], capture_output=True, text=True,
                              timeout=30, check=True)  # fmt: skip
        return done.stdout

    def screen(self) -> list[str]:
        return [line.rstrip() for line in self.tmux("capture-pane", "-p", "-t", "t").splitlines()]

    def text(self) -> str:
        return "\n".join(line for line in self.screen() if line)

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", "t", *keys)

    def type(self, line: str) -> None:
        self.tmux("send-keys", "-t", "t", "-l", line)
        self.keys("Enter")

    def wait_text(self, pattern: str, what: str) -> re.Match[str]:
        return wait_until(lambda: re.search(pattern, self.text(), re.M), f"{what} ({pattern!r})", within_s=60)

    def wait_prompt(self) -> None:
        """A bare prompt is the last line on the screen: bash waits for a command."""
        wait_until(lambda: (lines := [x for x in self.screen() if x]) and PROMPT.match(lines[-1]), "a bare prompt",
                   within_s=60)  # fmt: skip

    def dead_status(self) -> int:
        """dev's exit code, once it exited (the window's shell writes it)."""
        return int(wait_until(lambda: self.status.exists() and self.status.read_text(), "dev to exit", within_s=60))

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.server, "kill-server"], capture_output=True, timeout=30)


@pytest.fixture
def tmux_dev() -> Iterator[list[Tmux]]:
    made: list[Tmux] = []
    yield made
    for session in made:
        session.close()


def _proc_state(argv: list[str]) -> str | None:
    """The state letter of the one process whose argv is ``argv`` (a number no other test uses), else None."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "cmdline").read_bytes().split(b"\0")[:-1] == [a.encode() for a in argv]:
                return (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
    return None


def _events(sandbox: str) -> list[dict[str, object]]:
    path = Path(os.environ["XDG_STATE_HOME"]) / "openshell-sandbox" / sandbox / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_dev_bash_is_an_interactive_shell(tmux_dev: list[Tmux]) -> None:
    box = Tmux()
    tmux_dev.append(box)
    box.wait_prompt()
    ready = box.wait_text(r"sandbox (dev-[0-9a-f]+) is ready", "the ready line")
    sandbox = ready.group(1)
    first = box.screen()
    assert not any("no job control" in line or "cannot set terminal process group" in line for line in first)
    assert not any("I have no name" in line for line in first)

    box.type('tty; id -un; echo "term=$TERM home=$HOME"')
    box.wait_text(r"^term=", "the answers")
    text = box.text()
    assert re.search(r"^/dev/pts/\d+$", text, re.M), text  # the agent's own devpts: `tty` names its terminal
    assert re.search(r"^sandbox$", text, re.M), text
    workdir = Path(os.environ["XDG_STATE_HOME"]) / "openshell-sandbox" / sandbox / "work"
    home = os.path.realpath(workdir)
    assert re.search(rf"^term=screen-256color home={re.escape(home)}$", text, re.M), text  # TERM is the caller's

    # Job control: Ctrl-Z stops the foreground job, fg brings it back, Ctrl-C ends it: the sandbox goes on.
    box.type("sleep 4711")
    wait_until(lambda: _proc_state(["sleep", "4711"]) in ("S", "R"), "the sleep to run")
    box.keys("C-z")
    box.wait_text(r"Stopped\s+sleep 4711", "the job stopped by Ctrl-Z")
    assert _proc_state(["sleep", "4711"]) == "T"
    box.wait_prompt()
    box.type("fg")
    wait_until(lambda: _proc_state(["sleep", "4711"]) in ("S", "R"), "the sleep to run again after fg")
    box.keys("C-c")
    wait_until(lambda: _proc_state(["sleep", "4711"]) is None, "the sleep ended by Ctrl-C")
    box.wait_prompt()
    box.type('echo "after-int=$?"')
    box.wait_text(r"^after-int=130$", "the sleep's SIGINT status")
    box.type("sleep 4712")
    wait_until(lambda: _proc_state(["sleep", "4712"]) in ("S", "R"), "the second sleep to run")
    box.keys("C-\\")
    box.wait_prompt()
    box.type('echo "after-quit=$?"')
    box.wait_text(r"^after-quit=131$", "the sleep's SIGQUIT status (Ctrl-\\)")

    box.type("clear")
    wait_until(lambda: (lines := [x for x in box.screen() if x]) and len(lines) == 1 and PROMPT.match(lines[0]),
               "a cleared screen holding only the prompt", within_s=60)  # fmt: skip

    box.type("exit 3")
    assert box.dead_status() == 3
    events = _events(sandbox)
    kinds = [e.get("event") for e in events]
    assert "agent.exited" in kinds and "boundary.exit" in kinds
    assert "limits.pids-cgroup-left" not in kinds and "limits.memory-cgroup-left" not in kinds
    for event in events:  # the workload's cgroups are gone
        if event.get("event") in ("limits.pids", "limits.memory") and isinstance(event.get("cgroup"), str):
            path = str(event["cgroup"]).split()[-1]
            assert path.startswith("/sys/fs/cgroup/") and not Path(path).exists(), path


def test_dev_terminal_follows_resize_and_stops_on_the_escape(tmux_dev: list[Tmux]) -> None:
    box = Tmux()
    tmux_dev.append(box)
    box.wait_prompt()
    box.type("stty size")
    box.wait_text(r"^30 100$", "the initial size")
    box.tmux("resize-window", "-t", "t", "-x", "120", "-y", "40")
    box.type("clear; stty size")
    box.wait_text(r"^40 120$", "the new size after SIGWINCH")
    box.type("sleep 4713")  # the escape works while a program runs, at the start of a line
    wait_until(lambda: _proc_state(["sleep", "4713"]) in ("S", "R"), "the sleep to run")
    box.keys("Enter")
    box.tmux("send-keys", "-t", "t", "-l", "~.")
    assert box.dead_status() == 137  # the agent's result: an interactive bash ignores SIGTERM, the sweep kills it
    assert _proc_state(["sleep", "4713"]) is None
    assert "stopping the sandbox (escape)" in box.text()


def test_dev_lines_wait_for_the_agents_line_to_end(tmux_dev: list[Tmux]) -> None:
    """A refusal while bash waits at its prompt is printed after the next line the agent writes, never into
    the prompt."""
    box = Tmux()
    tmux_dev.append(box)
    box.wait_prompt()
    sandbox = box.wait_text(r"sandbox (dev-[0-9a-f]+) is ready", "the ready line").group(1)
    box.type("(sleep 1; getent hosts refused-4714.example) &")
    wait_until(
        lambda: any(e.get("event") == "dns" and "refused-4714" in str(e.get("name")) for e in _events(sandbox)),
        "the DNS refusal in the events",
    )
    wait_until(lambda: _proc_state(["getent", "hosts", "refused-4714.example"]) is None, "getent to end")
    refusal = r"^openshell-sandbox: refused DNS name refused-4714\.example"

    def next_line_then_refusal() -> re.Match[str] | None:
        # the next line of the agent's output releases the held line; on a busy machine dev may read the event
        # only after bash drew its next prompt, and then the line waits for the line after that
        box.keys("Enter")
        deadline = time.monotonic() + 3
        while not (found := re.search(refusal, box.text(), re.M)) and time.monotonic() < deadline:
            time.sleep(0.05)
        return found

    wait_until(next_line_then_refusal, "the refusal line", within_s=60, interval=0)
    assert not any("$ openshell-sandbox:" in line for line in box.screen()), box.screen()
    box.type("exit")
    assert box.dead_status() == 0

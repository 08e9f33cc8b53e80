"""Dev's terminal, the pure parts (supervisor/cli/dev_terminal.py): the escape sequence and the gate that keeps
dev's lines out of the agent's prompt."""

from __future__ import annotations

import pytest

from supervisor.cli.dev_terminal import EscapeFilter, Gate, parse_escape


def test_escape_stops_only_at_the_start_of_a_line() -> None:
    keys = EscapeFilter(ord("~"))
    assert keys.feed(b"~.") == (b"", ["stop"])  # the very first key starts a line
    keys = EscapeFilter(ord("~"))
    assert keys.feed(b"echo a~.b\r") == (b"echo a~.b\r", [])
    assert keys.feed(b"~.rest") == (b"", ["stop"])  # nothing after the stop is sent


def test_escape_doubled_sends_it_once_and_other_keys_pass_with_it() -> None:
    keys = EscapeFilter(ord("~"))
    assert keys.feed(b"~~x\r~?~a") == (b"~x\r~a", ["help"])
    assert keys.feed(b"\x03\x1a\x1c") == (b"\x03\x1a\x1c", [])  # Ctrl-C, Ctrl-Z, Ctrl-\ are the agent's
    split = EscapeFilter(ord("~"))
    assert split.feed(b"~") == (b"", []) and split.feed(b".") == (b"", ["stop"])  # across reads
    assert EscapeFilter(None).feed(b"~.") == (b"~.", [])


def test_parse_escape() -> None:
    assert parse_escape("~") == ord("~") and parse_escape("^]") == 0x1D and parse_escape("none") is None
    with pytest.raises(ValueError):
        parse_escape("ab")


def test_dev_lines_wait_for_the_end_of_the_agents_line() -> None:
    out: list[bytes] = []
    gate = Gate(write_out=lambda b: out.append(b"O:" + b), write_err=lambda b: out.append(b"E:" + b))
    gate.output(b"sandbox@vm:~$ ")
    gate.say("openshell-sandbox: refused x")
    assert out == [b"O:sandbox@vm:~$ "]  # never into the prompt
    gate.output(b"\r\n[1]+ Done\r\nsandbox@vm:~$ ")  # one chunk: the line goes out after its last full line
    assert out[1:] == [b"O:\r\n[1]+ Done\r\n", b"E:openshell-sandbox: refused x\r\n", b"O:sandbox@vm:~$ "]


def test_dev_lines_wait_for_the_alternate_screen_to_close() -> None:
    out: list[bytes] = []
    gate = Gate(write_out=out.append, write_err=out.append)
    gate.output(b"\x1b[?1049hfull screen\r\n")
    gate.say("held")
    assert b"held\r\n" not in out
    gate.output(b"\x1b[?1049l\r\n")
    assert out[-1] == b"held\r\n"
    gate.output(b"partial")
    gate.say("at the end")
    gate.drain()
    assert out[-2:] == [b"\r\n", b"at the end\r\n"]

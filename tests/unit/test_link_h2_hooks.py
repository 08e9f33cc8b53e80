"""The link's hooks below h2's public API (supervisor/link/h2_hooks.py) still fit the installed h2, hpack and
hyperframe. Each check names its hook, so an upgrade that moves one fails here, saying what to re-check, instead
of corrupting a link's byte stream."""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from importlib import metadata
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import h2.settings
import hpack
import hyperframe.frame
import pytest

from supervisor.link import h2_hooks

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
HOOKED = ("h2", "hpack", "hyperframe")


def moved(hook: str, what: str) -> str:
    versions = ", ".join(f"{name} {metadata.version(name)}" for name in HOOKED)
    return (
        f"h2 hook {hook!r}: {what} ({versions}). The dependency changed underneath supervisor/link/h2_hooks.py: "
        "re-check the hook there, then the version pins in pyproject.toml"
    )


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


@pytest.mark.parametrize("name", HOOKED)
def test_the_installed_version_is_inside_the_pinned_range(name: str) -> None:
    """pyproject.toml pins each hooked package to a range with an upper bound; what runs is inside it."""
    spec = next((line for line in PYPROJECT.read_text().splitlines() if re.match(rf'\s*"{name}[<>=]', line)), None)
    assert spec is not None, f"pyproject.toml pins no version range for {name}, which supervisor/link/h2_hooks.py hooks"
    lower = re.search(r">=\s*([\d.]+)", spec)
    upper = re.search(r"<\s*([\d.]+)", spec)
    assert lower and upper, f"{name} needs a lower and an upper bound in pyproject.toml: {spec.strip()}"
    installed = _version(metadata.version(name))
    assert _version(lower.group(1)) <= installed < _version(upper.group(1)), moved(name, "outside the pinned range")


def test_prepare_for_sending_is_the_one_funnel_into_the_output_buffer() -> None:
    """Hook 3 overrides ``_prepare_for_sending(frames)`` and drains ``_data_to_send``: h2 must still send every
    frame through the first and keep its output in the second, a bytearray written nowhere else."""
    method = getattr(h2.connection.H2Connection, "_prepare_for_sending", None)
    assert method is not None, moved("_prepare_for_sending", "h2.connection.H2Connection has no such method")
    params = list(inspect.signature(method).parameters)
    assert params == ["self", "frames"], moved("_prepare_for_sending", f"its parameters are now {params}")
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    buffer = getattr(conn, "_data_to_send", None)
    assert isinstance(buffer, bytearray), moved("_data_to_send", f"it is {type(buffer).__name__}, not a bytearray")

    tree = ast.parse(textwrap.dedent(inspect.getsource(h2.connection.H2Connection)))
    writers: set[str] = set()
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef):
            continue
        for node in ast.walk(function):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, ast.AugAssign) else []  # fmt: skip
            if any(isinstance(t, ast.Attribute) and t.attr == "_data_to_send" for t in targets):
                writers.add(function.name)
    # initiate_connection appends the preface before any frame exists: the hook drains the buffer in order
    expected = {"__init__", "initiate_connection", "_prepare_for_sending", "data_to_send", "clear_outbound_data_buffer"}
    assert writers <= expected, moved("_data_to_send", f"also written by {sorted(writers - expected)}")


def test_hooked_connection_writes_what_h2_writes() -> None:
    """The same exchange through h2's own output path and through the hook: byte for byte the same stream."""

    def exchange(conn: h2.connection.H2Connection) -> bytes:
        conn.initiate_connection()
        conn.update_settings({h2.settings.SettingCodes.MAX_FRAME_SIZE: 65536})
        stream_id = conn.get_next_available_stream_id()
        conn.send_headers(
            stream_id, [(":method", "POST"), (":path", "/"), (":scheme", "https"), (":authority", "a.test")]
        )
        conn.send_data(stream_id, b"s" * 100)
        conn.send_data(stream_id, b"L" * 16000)
        conn.increment_flow_control_window(1 << 20)
        conn.send_data(stream_id, b"e" * 5000, end_stream=True)
        if isinstance(conn, h2_hooks.H2Connection):
            return b"".join(conn.chunks_to_send())
        return conn.data_to_send()

    config = h2.config.H2Configuration(client_side=True)
    plain = h2.connection.H2Connection(config=config)
    plain.encoder = h2_hooks.PlainEncoder()
    hooked = h2_hooks.H2Connection(config=config)
    expected = exchange(plain)
    assert exchange(hooked) == expected, moved("_prepare_for_sending", "the hooked output differs from h2's own")

    server = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    server.initiate_connection()
    events = server.receive_data(expected)
    received = b"".join(e.data for e in events if isinstance(e, h2.events.DataReceived))
    assert received == b"s" * 100 + b"L" * 16000 + b"e" * 5000
    assert any(isinstance(e, h2.events.StreamEnded) for e in events)


def test_plain_encoder_codes_literals_without_huffman() -> None:
    params = inspect.signature(hpack.Encoder.encode).parameters
    assert "huffman" in params, moved("Encoder.encode", f"hpack's encode takes {list(params)}")
    conn = h2_hooks.H2Connection(h2.config.H2Configuration(client_side=True))
    assert isinstance(conn.encoder, h2_hooks.PlainEncoder), moved("encoder", "h2 no longer keeps it as .encoder")
    headers = [("x-openshell-destination", "example.com:443")]
    wire = h2_hooks.PlainEncoder().encode(headers)
    assert b"example.com:443" in wire, moved("Encoder.encode", "huffman=False no longer writes literals as they are")
    assert hpack.Decoder().decode(wire) == headers


def test_data_frame_repr_is_cheap() -> None:
    assert hasattr(hyperframe.frame.DataFrame, "_body_repr"), moved("_body_repr", "hyperframe's DataFrame lost it")
    frame = hyperframe.frame.DataFrame(1, data=b"\x00" * 100_000)
    assert "<100000 bytes>" in repr(frame), moved("_body_repr", "repr(DataFrame) no longer uses it")
    for attribute in ("pad_length", "body_len", "flags", "data", "stream_id"):
        assert hasattr(frame, attribute), moved("_prepare_for_sending", f"DataFrame has no {attribute!r}")

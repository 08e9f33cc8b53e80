"""What the fuzz targets found (fuzz/, docs/design.md "Testing"), one test per finding, each input also kept in
its target's corpus. Every one was an exception the parser's callers do not handle: a refusal has to be the
parser's own error, never whatever Python raised on the way."""

from __future__ import annotations

import dns.flags
import dns.message
import pytest

from supervisor.boundary.capture.dns_stub import servfail
from supervisor.boundary.forkimage import child, messages, wire
from supervisor.control.dns_answers import read_query
from supervisor.protocol.request_head import HeadError, HeadProblem, check_head

# -- l7_request: a request target with a byte above ASCII escaped check_head as UnicodeDecodeError ---------------


@pytest.mark.parametrize("target", [b"/\x89", b"\x89http://api.test:[080/x", "/é".encode()])
def test_a_non_ascii_request_target_is_a_head_error(target: bytes) -> None:
    with pytest.raises(HeadError) as info:
        check_head(b"GET " + target + b" HTTP/1.1\r\nHost: api.test\r\n\r\n")
    assert info.value.problem is HeadProblem.REQUEST_LINE


# -- dns: a response sent where a query belongs made dnspython's make_response raise ------------------------------


def _response_wire() -> bytes:
    query = dns.message.make_query("example.com.", "A")
    return dns.message.make_response(query).to_wire()


def test_control_reads_a_response_as_no_query() -> None:
    wire = _response_wire()
    assert dns.message.from_wire(wire).flags & dns.flags.QR
    assert read_query(wire) is None
    assert read_query(b"\x00\x01garbage") is None
    assert read_query(dns.message.make_query("example.com.", "A").to_wire()) is not None


def test_the_stub_gives_a_response_no_servfail() -> None:
    assert servfail(_response_wire()) is None
    assert servfail(dns.message.make_query("example.com.", "A").to_wire()) is not None


# -- zygote: the launcher wire raised RecursionError and OverflowError past its readers ----------------------------


@pytest.mark.parametrize("data", [b"[" * 100_000, b'{"a":' * 100_000])
def test_a_message_nested_too_deeply_is_a_protocol_error(data: bytes) -> None:
    with pytest.raises(OSError, match="bad launcher message"):
        wire.decode(data, [], 0)


GOOD = child.SpawnSpec(("/bin/true",), {"A": "b"}, "/", 1000, 1000, (1000,)).to_wire()


@pytest.mark.parametrize(
    "change",
    [
        {"uid": float("inf")},  # json.loads reads Infinity: int() of it was an OverflowError
        {"gid": 1.5},
        {"uid": "1000"},
        {"uid": True},
        {"groups": [float("-inf")]},
        {"groups": 5},
        {"argv": [1, 2]},  # validate() then raised TypeError on an int
        {"argv": "/bin/true"},
        {"env": {"A": 1}},
        {"env": ["A=b"]},
        {"cwd": 7},
        {"cols": float("nan")},
        {"landlock": {"read_only": [1], "read_write": []}},
        {"landlock": "x"},
    ],
)
def test_a_spawn_spec_of_the_wrong_types_is_refused_when_read(change: dict[str, object]) -> None:
    assert child.SpawnSpec.from_wire(GOOD) == child.SpawnSpec.from_wire(child.SpawnSpec.from_wire(GOOD).to_wire())
    with pytest.raises((TypeError, ValueError)):
        child.SpawnSpec.from_wire({**GOOD, **change})


def test_a_spawn_spec_read_from_json_infinity_is_refused() -> None:
    message, _ = wire.decode(b'{"spec": {"argv": ["/bin/true"], "env": {}, "cwd": "/", "uid": Infinity, "gid": 0}}',
                               [], 0)  # fmt: skip
    with pytest.raises(TypeError):
        child.SpawnSpec.from_wire(message["spec"])


@pytest.mark.parametrize("ids", [[1000], [1, 2, 3], "ab", 5, [1e309, 0], ["1", "2"]])
def test_a_plan_with_malformed_agent_ids_is_refused(ids: object) -> None:
    wire = messages.NamespacePlan("U", agent_ids=(1000, 1000)).to_wire()
    assert messages.NamespacePlan.from_wire(wire).agent_ids == (1000, 1000)
    with pytest.raises((TypeError, ValueError)):
        messages.NamespacePlan.from_wire({**wire, "agent_ids": ids})

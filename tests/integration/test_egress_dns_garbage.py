"""From the agent's side: DNS bytes the boundary hands control as they came (a response where a query belongs,
garbage) get a header-only FORMERR on their own stream; the handler returns normally. An exception out of the
handler would end the whole egress link it rides on, and every tunnel on it (link/h2link.py ``_run_handler``)."""

from __future__ import annotations

import dns.message
import dns.rcode
import pytest

from supervisor.protocol.egress import encode_dns_request_headers
from tests.integration.test_egress_outcomes import _AgentSide, _service


class _DnsStream(_AgentSide):
    def __init__(self, wire: bytes) -> None:
        super().__init__(encode_dns_request_headers(len(wire)))
        self.wire = wire
        self.sent = bytearray()

    async def read_all(self, limit: int) -> bytes:
        return self.wire[:limit]

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self.sent += data


def _response_to(name: str) -> bytes:
    return dns.message.make_response(dns.message.make_query(name, "A")).to_wire()


@pytest.mark.parametrize(
    "wire",
    [_response_to("dns.test."), _response_to("not-in-policy.example."), b"\x12\x34" + b"\xff" * 30],
    ids=["response-for-an-eligible-name", "response-for-another-name", "garbage"],
)
async def test_a_malformed_dns_message_is_answered_formerr_and_the_handler_survives(wire: bytes) -> None:
    service, log = _service()
    stream = _DnsStream(wire)
    await service.handle(stream)  # type: ignore[arg-type]
    answer = bytes(stream.sent)
    assert answer[:2] == wire[:2] and len(answer) == 12
    assert answer[3] & 0x0F == dns.rcode.FORMERR
    assert not [e for e in log.events if e["event"] == "dns"]  # nothing was resolved or even planned


async def test_a_query_is_still_answered() -> None:
    service, _ = _service()
    stream = _DnsStream(dns.message.make_query("not-in-policy.example.", "A").to_wire())
    await service.handle(stream)  # type: ignore[arg-type]
    assert dns.message.from_wire(bytes(stream.sent)).rcode() == dns.rcode.REFUSED

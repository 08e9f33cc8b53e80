"""An absolute-form request (capture ``http-forward``) is HTTP by construction: control parses the origin's
answer as HTTP whichever first bytes arrive first. Before, an origin that spoke first — its bytes already
waiting when the agent's request head reached control — turned the connection into a raw relay, while the same
request a moment earlier got a 502: the outcome of one agent action depended on timing (the load flake of
tests/e2e/test_control_loss.py). Driven through ``EgressService.serve`` in process, the origin on loopback.
"""

from __future__ import annotations

from collections.abc import Sequence
from ipaddress import IPv4Address, IPv6Address

import trio
import trio.testing

from supervisor.control.credentials import Credentials
from supervisor.control.egress import EgressService, Interception
from supervisor.control.l7 import InterceptionCA, upstream_context
from supervisor.control.policy import Decision, PolicyStore, compile_policy, load_policy_text
from supervisor.control.upstream import UpstreamConfig
from supervisor.jsonlog import JsonLog
from supervisor.protocol.egress import CaptureKind, EgressRequest, decode_reply_headers
from tests.unit.policy_helpers import PY, doc, rule

HOST, PORT = "plain.test", 80
HEAD = b"GET /file HTTP/1.1\r\nHost: plain.test\r\n\r\n"
DRIP = b"d" * 1024  # not HTTP: what a server-first protocol (or the test host's drip) sends on accept
_CA = InterceptionCA.generate("forward-origin-first-tests")


class _ForwardStream(trio.abc.HalfCloseableStream):
    """The boundary's side of an http-forward stream: the origin-form head is offered only once ``ready`` is
    set (the origin's bytes are then already in control's socket), then EOF (a bodiless request)."""

    def __init__(self, ready: trio.Event) -> None:
        self.ready = ready
        self.reply: list[tuple[str, str]] | None = None
        self.received = bytearray()
        self.ended = trio.Event()
        self._sent_head = False

    async def send_headers(
        self, headers: Sequence[tuple[str, str]], *, end_stream: bool = False, now: bool = False
    ) -> None:
        self.reply = list(headers)
        await trio.lowlevel.checkpoint()

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self.received += data
        await trio.lowlevel.checkpoint()

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    async def send_eof(self) -> None:
        self.ended.set()
        await trio.lowlevel.checkpoint()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        if self._sent_head:
            await trio.sleep_forever()  # the agent waits for its answer; control ends the stream
        await self.ready.wait()
        self._sent_head = True
        return HEAD

    async def aclose(self) -> None:
        self.ended.set()
        await trio.lowlevel.checkpoint()

    async def reset(self) -> None:
        await self.aclose()


class _Service(EgressService):
    """The upstream dial replaced by one to a loopback origin (real vetting refuses loopback)."""

    port = 0

    async def _dial(
        self, request: EgressRequest, name: str | None, decision: Decision
    ) -> tuple[trio.SocketStream, IPv4Address | IPv6Address]:
        return await trio.open_tcp_stream("127.0.0.1", self.port), IPv4Address("127.0.0.1")


async def test_an_origin_speaking_first_does_not_turn_an_absolute_form_request_raw() -> None:
    text = doc({"plain": rule({"host": HOST, "port": PORT}, binaries=(PY,))})
    store = PolicyStore(compile_policy(load_policy_text(text, "t.yaml")), source="t.yaml")
    interception = Interception(_CA, Credentials.from_mapping({}), upstream_context(system_trust=False))
    service = _Service(store, UpstreamConfig(), JsonLog("control", stream=None), interception=interception,
                       relaxed=True)  # fmt: skip
    origin_sent = trio.Event()

    async def origin(stream: trio.SocketStream) -> None:  # speaks first, never HTTP, then closes
        await stream.send_all(DRIP * 64)
        origin_sent.set()
        await stream.aclose()

    request = EgressRequest(host=HOST, port=PORT, capture=CaptureKind.HTTP_FORWARD, identity=None,
                            conn_id="c1", src_port=1)  # fmt: skip
    stream = _ForwardStream(origin_sent)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(trio.serve_tcp, origin, 0)
            service.port = listeners[0].socket.getsockname()[1]
            await service.serve(stream, request)
            nursery.cancel_scope.cancel()
    assert stream.reply is not None and decode_reply_headers(stream.reply).status == 200
    # the origin's bytes were never relayed as the answer: the agent got an HTTP error from control
    assert bytes(stream.received).startswith(b"HTTP/1.1 502 "), bytes(stream.received[:200])
    assert DRIP not in stream.received

"""A refused or lost link, on in-memory transports: every rpc exchange turns a lost link into
``OpError(unavailable)`` wherever it is lost, and a refusal after the handshake reaches the refused side as a
GOAWAY naming the field, never a value."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
import trio.testing

from supervisor.link.h2link import Link, LinkStream
from supervisor.link.refusal import refusal_debug_data, send_refusal
from supervisor.link.rpc import Router, call, open_channel
from supervisor.protocol.errors import ErrorKind, OpError


@pytest.mark.parametrize("client", [True, False], ids=["refuser-is-h2-client", "refuser-is-h2-server"])
async def test_refusal_reaches_the_peer_as_a_goaway_naming_the_field(client: bool) -> None:
    ours, theirs = trio.testing.memory_stream_pair()
    refused = Link(theirs, client=not client, name="refused")
    async with trio.open_nursery() as nursery:
        await nursery.start(refused.run)
        await send_refusal(ours, client=client, field="sandbox_uid", grace=5)
        with trio.fail_after(5):
            await refused.wait_closed()
        nursery.cancel_scope.cancel()
    assert refused.refused_field == "sandbox_uid"
    assert refused.close_reason == "peer sent GOAWAY (INADEQUATE_SECURITY: refused field=sandbox_uid)"


@pytest.mark.parametrize(
    ("field", "data"),
    [("generation", b"refused field=generation"), ("role", b"refused field=role"), (None, b"refused field=certificate"),
     ("7c0e-uid-value", b"refused field=certificate"), ("x" * 41, b"refused field=certificate")],
)  # fmt: skip
def test_debug_data_is_a_field_name_only(field: str | None, data: bytes) -> None:
    assert refusal_debug_data(field) == data


async def test_hostile_goaway_debug_data_is_sanitised() -> None:
    import h2.config
    import h2.connection

    ours, theirs = trio.testing.memory_stream_pair()
    link = Link(theirs, client=True)
    peer = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    peer.initiate_connection()
    peer.close_connection(error_code=0, additional_data=b"\x1b[31mrefused field=evil\nfake log line" + b"x" * 500)
    async with trio.open_nursery() as nursery:
        await nursery.start(link.run)
        await ours.send_all(peer.data_to_send())
        with trio.fail_after(5):
            await link.wait_closed()
        nursery.cancel_scope.cancel()
    assert link.refused_field is None
    reason = link.close_reason or ""
    assert "\n" not in reason and "\x1b" not in reason and len(reason) < 260


Handler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


async def _serve(handler: Handler, act: Callable[[Link], Awaitable[Any]]) -> OpError:
    """Run ``act`` against a server whose one operation is ``handler``; return the OpError it raised."""
    left, right = trio.testing.memory_stream_pair()
    client = Link(left, client=True)
    router = Router()
    router.unary_raw("/v1/op", handler)

    async def channel(body: dict[str, Any], stream: LinkStream, accept: Any) -> None:
        await handler(body)

    router.channel_raw("/v1/chan", channel)
    server = Link(right, client=False, handler=router.handle)
    async with trio.open_nursery() as nursery:
        await nursery.start(client.run)
        await nursery.start(server.run)
        server_ref.append(server)
        with pytest.raises(OpError) as info, trio.fail_after(5):
            await act(client)
        nursery.cancel_scope.cancel()
    server_ref.clear()
    return info.value


server_ref: list[Link] = []


async def _hang_up(body: dict[str, Any]) -> dict[str, Any]:
    await trio.aclose_forcefully(server_ref[0].transport)
    await trio.sleep_forever()
    return {}


@pytest.mark.parametrize("kind", ["unary", "channel"])
async def test_link_lost_mid_exchange_is_unavailable(kind: str) -> None:
    async def act(link: Link) -> Any:
        if kind == "unary":
            return await call(link, "/v1/op", {})
        return await open_channel(link, "/v1/chan", {})

    error = await _serve(_hang_up, act)
    assert error.kind is ErrorKind.UNAVAILABLE and "link lost" in error.reason


@pytest.mark.parametrize("kind", ["unary", "channel"])
async def test_link_already_closed_is_unavailable_not_linkclosed(kind: str) -> None:
    async def act(link: Link) -> Any:
        await link.aclose()
        if kind == "unary":
            return await call(link, "/v1/op", {})
        return await open_channel(link, "/v1/chan", {})

    async def never(body: dict[str, Any]) -> dict[str, Any]:
        raise AssertionError("never called")

    error = await _serve(never, act)
    assert error.kind is ErrorKind.UNAVAILABLE

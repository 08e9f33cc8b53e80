"""Which egress link a connection is handed to (``EgressLinks.pick``), and what control keeps per connection.

The pick takes the least busy live link at once when one is up, waits at most ``LINK_WAIT_S`` for one to appear
otherwise, and never returns a closed link. Control's per-connection records have no instance ``__dict__``
(``ConnectionResult`` and ``_Live`` live as long as the connection: idle memory per connection).
"""

from __future__ import annotations

import io
from typing import Any, cast

import pytest
import trio
import trio.testing

from supervisor.boundary.egress import LINK_WAIT_S, EgressLinks
from supervisor.control.connection_result import ConnectionResult
from supervisor.control.egress import _Live
from supervisor.jsonlog import JsonLog
from supervisor.link.h2link import Link


class FakeLink:
    def __init__(self, active: int, closed: bool = False) -> None:
        self.active_streams = active
        self.closed = closed


def pool_of(*links: FakeLink) -> EgressLinks:
    pool = EgressLinks()
    for link in links:
        pool.add(cast(Link, link))
    return pool


async def test_the_least_busy_live_link_is_picked_without_waiting(autojump_clock: trio.testing.MockClock) -> None:
    busy, idle, closed_idler = FakeLink(5), FakeLink(1), FakeLink(0, closed=True)
    pool = pool_of(busy, idle, closed_idler)
    start = trio.current_time()
    assert await pool.pick() is cast(Link, idle)
    assert trio.current_time() == start  # no wait at all (autojump clock: any sleep would move it)


async def test_equally_busy_links_are_taken_in_turn_so_connections_spread_over_them(
    autojump_clock: trio.testing.MockClock,
) -> None:
    links = [FakeLink(0), FakeLink(0), FakeLink(0, closed=True), FakeLink(0)]
    pool = pool_of(*links)
    picked = [await pool.pick() for _ in range(6)]
    live = [cast(Link, link) for link in links if not link.closed]
    assert picked == live + live  # every live link once, in turn, and never the closed one
    links[3].active_streams = 2  # a busier link is passed over while the others are free
    assert [await pool.pick() for _ in range(4)] == [live[0], live[1]] * 2


async def test_no_live_link_is_a_refusal_after_the_wait(autojump_clock: trio.testing.MockClock) -> None:
    pool = pool_of(FakeLink(0, closed=True))
    start = trio.current_time()
    assert await pool.pick() is None
    assert trio.current_time() - start == pytest.approx(LINK_WAIT_S)


async def test_a_link_that_comes_up_during_the_wait_is_picked(autojump_clock: trio.testing.MockClock) -> None:
    pool = EgressLinks()
    late = FakeLink(3)
    picked: list[Any] = []

    async def picker() -> None:
        picked.append(await pool.pick())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(picker)
        await trio.sleep(LINK_WAIT_S / 2)
        pool.add(cast(Link, FakeLink(0, closed=True)))  # a wake-up with no live link: keeps waiting
        await trio.sleep(LINK_WAIT_S / 4)
        pool.add(cast(Link, late))
    assert picked == [late]


async def test_controls_per_connection_records_have_no_instance_dict() -> None:
    result = ConnectionResult(JsonLog("control", stream=io.StringIO()), {"failed": 0}, None)
    assert not hasattr(result, "__dict__")
    with pytest.raises(AttributeError):
        result.unexpected = 1  # type: ignore[attr-defined]
    live = _Live(request=None, host="h", identity=None, generation=1, scope=trio.CancelScope(), inspected=False)  # type: ignore[arg-type]
    assert not hasattr(live, "__dict__")

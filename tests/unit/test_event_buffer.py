"""Control's ring of recent events behind ``GET /v1/events``: tail, kinds, follow, wake-ups from threads."""

from __future__ import annotations

import trio
import trio.testing

from supervisor.control.events import EventBuffer, matches
from supervisor.jsonlog import JsonLog


def test_kinds_match_the_event_and_its_dotted_family() -> None:
    assert matches({"event": "egress.refused"}, ["egress"]) and matches({"event": "egress"}, ["egress"])
    assert not matches({"event": "egressive"}, ["egress"]) and not matches({"event": "dns"}, ["egress"])
    assert matches({"event": "anything"}, [])


def test_tail_and_after_with_a_bounded_ring() -> None:
    buffer = EventBuffer(capacity=3)
    for n in range(5):
        buffer.record({"event": "egress" if n % 2 else "dns", "n": n})
    events, seq = buffer.tail(10)
    assert [e["n"] for e in events] == [2, 3, 4] and seq == 5  # the oldest two were dropped
    assert [e["n"] for e in buffer.tail(1)[0]] == [4]
    assert buffer.tail(0)[0] == []
    assert [e["n"] for e in buffer.tail(10, ["egress"])[0]] == [3]
    assert [e["n"] for e in buffer.after(3)[0]] == [3, 4]


def test_jsonlog_feeds_the_buffer_every_line() -> None:
    buffer = EventBuffer()
    log = JsonLog("control", sandbox="s", to_stream=False)
    log.tap = buffer.record
    log.emit("egress", decision="deny", rule=None)
    [event], _ = buffer.tail(1)
    assert event["event"] == "egress" and event["decision"] == "deny" and "rule" not in event


async def test_a_follower_wakes_for_events_from_tasks_and_threads() -> None:
    buffer = EventBuffer()
    buffer.bind()
    _, seq = buffer.tail(10)
    seen: list[int] = []

    async def follow() -> None:
        nonlocal seq
        while len(seen) < 2:
            await buffer.wait_after(seq)
            events, seq = buffer.after(seq)
            seen.extend(e["n"] for e in events)

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(follow)
            await trio.testing.wait_all_tasks_blocked()
            buffer.record({"event": "a", "n": 1})  # from a trio task
            await trio.testing.wait_all_tasks_blocked()
            await trio.to_thread.run_sync(buffer.record, {"event": "b", "n": 2})  # from a worker thread
    assert seen == [1, 2]

"""Control's ring of recent events behind ``GET /v1/events``: tail, kinds, follow, wake-ups from threads."""

from __future__ import annotations

import trio
import trio.testing

from supervisor.control.events import EventBuffer, matches
from supervisor.jsonlog import JsonLog
from supervisor.protocol.event_names import EventName
from supervisor.protocol.event_record import Event


def _event(name: EventName, **fields: object) -> Event:
    return Event.build(name, "control", "s", **fields)


def test_kinds_match_the_event_and_its_dotted_family() -> None:
    assert matches(_event(EventName.EGRESS_REFUSED), ["egress"]) and matches(_event(EventName.EGRESS), ["egress"])
    assert not matches(_event(EventName.EGRESS), ["egres"]) and not matches(_event(EventName.DNS), ["egress"])
    assert matches(_event(EventName.HTTP), [])


def test_tail_and_after_with_a_bounded_ring() -> None:
    buffer = EventBuffer(capacity=3)
    for n in range(5):
        buffer.record(_event(EventName.EGRESS if n % 2 else EventName.DNS, n=n))
    events, seq = buffer.tail(10)
    assert [e.fields["n"] for e in events] == [2, 3, 4] and seq == 5  # the oldest two were dropped
    assert [e.fields["n"] for e in buffer.tail(1)[0]] == [4]
    assert buffer.tail(0)[0] == []
    assert [e.fields["n"] for e in buffer.tail(10, ["egress"])[0]] == [3]
    assert [e.fields["n"] for e in buffer.after(3)[0]] == [3, 4]


def test_jsonlog_feeds_the_buffer_every_line() -> None:
    buffer = EventBuffer()
    log = JsonLog("control", sandbox="s", to_stream=False)
    log.tap = buffer.record
    log.emit(EventName.EGRESS, decision="deny", rule=None)
    [event], _ = buffer.tail(1)
    assert event.name is EventName.EGRESS and event.fields == {"decision": "deny"}


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
            seen.extend(int(str(e.fields["n"])) for e in events)

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(follow)
            await trio.testing.wait_all_tasks_blocked()
            buffer.record(_event(EventName.EGRESS, n=1))  # from a trio task
            await trio.testing.wait_all_tasks_blocked()
            await trio.to_thread.run_sync(buffer.record, _event(EventName.DNS, n=2))  # from a worker thread
    assert seen == [1, 2]

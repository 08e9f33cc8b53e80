"""The pure parts of control's worker processes: the frames between primary and worker, a worker's view of the
pins, ``--workers`` and its ``auto``, and the channel over a socket pair (no daemon, no fork)."""

from __future__ import annotations

import io
import json
import socket
from pathlib import Path

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from supervisor.control.policy.identity import BinaryIdentity, DigestPins
from supervisor.control.workers.channel import Channel, ChannelClosed
from supervisor.control.workers.count import (
    MAX_WORKERS,
    auto_workers,
    cgroup_cpu_limit,
    cgroup_memory_limit,
    parse_workers,
)
from supervisor.control.workers.pins import UNREACHABLE, OwnedPins
from supervisor.control.workers.wire import MAX_FRAME, FrameDecoder, FrameError, Message, encode
from supervisor.jsonlog import JsonLog
from supervisor.protocol.event_names import EventName
from supervisor.protocol.event_record import Event

A = "a" * 64
B = "b" * 64

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@given(st.lists(st.dictionaries(st.text(max_size=8), json_values, max_size=4), max_size=5), st.data())
def test_frames_come_back_whole_however_the_bytes_are_cut(bodies: list[dict[str, object]], data: st.DataObject) -> None:
    messages = [{**body, "type": f"t{i}"} for i, body in enumerate(bodies)]
    stream = b"".join(encode(m) for m in messages)  # type: ignore[arg-type]
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    decoder = FrameDecoder()
    out: list[Message] = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        out += decoder.feed(stream[start:end])
    assert out == messages
    assert decoder.pending == 0


@pytest.mark.parametrize(
    ("frame", "why"),
    [
        ((MAX_FRAME + 1).to_bytes(4, "big"), "over"),
        (len(b"nope").to_bytes(4, "big") + b"nope", "not JSON"),
        (len(b"[1]").to_bytes(4, "big") + b"[1]", "'type'"),
        (len(b'{"type":1}').to_bytes(4, "big") + b'{"type":1}', "'type'"),
    ],
)
def test_a_frame_that_cannot_be_ours_is_an_error_not_a_skip(frame: bytes, why: str) -> None:
    with pytest.raises(FrameError, match=why):
        FrameDecoder().feed(frame)


def test_the_pins_a_worker_holds_are_the_primarys_and_it_never_records_one_itself() -> None:
    pins = OwnedPins()
    curl = BinaryIdentity("/w/curl", A)
    assert not pins.knows(curl)
    violation = pins.verify(curl)  # nothing asked of the primary yet: refused, not pinned here
    assert violation is not None and violation.unpinned == UNREACHABLE and "did not answer" in violation.describe()
    assert pins.pinned("/w/curl") is None and len(pins) == 0

    pins.learn("/w/curl", B)  # the primary had another digest first: first writer wins
    assert pins.knows(curl)
    changed = pins.verify(curl)
    assert changed is not None and changed.pinned == B and "hash changed" in changed.describe()
    assert pins.verify(BinaryIdentity("/w/curl", B)) is None

    pins.learn("/w/full", None)  # the primary's store is full: refused as one control would
    full = pins.verify(BinaryIdentity("/w/full", A))
    assert full is not None and "pin store is full" in full.describe()
    missing = pins.verify(BinaryIdentity("/w/curl", None))
    assert missing is not None and missing.missing


def test_a_workers_pins_decide_as_the_primarys_own_would() -> None:
    primary, worker = DigestPins(), OwnedPins()
    first, swapped = BinaryIdentity("/w/tool", A), BinaryIdentity("/w/tool", B)
    assert primary.verify(first) is None  # the primary saw it first
    worker.learn(first.path, primary.pinned(first.path))
    for identity in (first, swapped):
        ours, theirs = worker.verify(identity), primary.verify(identity)
        assert (ours is None) == (theirs is None)


def test_workers_flag(tmp_path: Path) -> None:
    assert parse_workers("3") == 3
    for bad, why in (("0", "not 1.."), (str(MAX_WORKERS + 1), "not 1.."), ("two", "neither")):
        with pytest.raises(ValueError, match=why):
            parse_workers(bad)
    assert auto_workers(cpus=8, limit=2) == 2
    assert auto_workers(cpus=2, limit=None) == 2
    assert auto_workers(cpus=500, limit=None) == MAX_WORKERS
    assert auto_workers(cpus=16, memory=512 * 1024 * 1024) == 512 // 64  # the processes fit the memory limit
    assert auto_workers(cpus=16, memory=10 * 1024 * 1024) == 1
    memory_max = tmp_path / "memory.max"
    memory_max.write_text("536870912\n")
    assert cgroup_memory_limit(memory_max) == 536870912
    memory_max.write_text("max\n")
    assert cgroup_memory_limit(memory_max) is None
    cpu_max = tmp_path / "cpu.max"
    cpu_max.write_text("150000 100000\n")
    assert cgroup_cpu_limit(cpu_max) == 2  # 1.5 CPUs: two processes, the second half used
    cpu_max.write_text("max 100000\n")
    assert cgroup_cpu_limit(cpu_max) is None
    assert cgroup_cpu_limit(tmp_path / "absent") is None
    assert 1 <= parse_workers("auto") <= MAX_WORKERS


async def test_requests_are_answered_in_any_order_and_notifications_arrive() -> None:
    left, right = socket.socketpair()
    primary, worker = Channel(left), Channel(right)
    notes: list[Message] = []
    noted = trio.Event()

    async def answer(message: Message) -> Message | None:
        if message["type"] == "slow":
            await trio.sleep(0.05)
        if "id" not in message:
            notes.append(message)
            noted.set()
            return None
        return {"echo": message["type"]}

    worker_ended = trio.Event()

    async def run_worker() -> None:
        await worker.run(answer)
        worker_ended.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(primary.run, answer)
        nursery.start_soon(run_worker)
        replies: dict[str, Message] = {}

        async def ask(kind: str) -> None:
            replies[kind] = await worker.request({"type": kind})

        async with trio.open_nursery() as asks:
            asks.start_soon(ask, "slow")
            asks.start_soon(ask, "fast")
        assert {k: v["echo"] for k, v in replies.items()} == {"slow": "slow", "fast": "fast"}
        worker.notify({"type": "event", "n": 1})
        with trio.fail_after(5):
            await noted.wait()
        assert notes == [{"type": "event", "n": 1}]
        left.close()  # the primary goes away: the worker's run returns, its requests fail
        with trio.fail_after(5):
            await worker_ended.wait()
        with pytest.raises(ChannelClosed):
            await worker.request({"type": "pin"})
        nursery.cancel_scope.cancel()


async def test_a_notification_from_another_thread_reaches_the_peer_and_the_run_survives() -> None:
    """A worker's log is written from threads too (the local addresses' refresh): its notifications must reach the
    primary, and the channel's run must end cleanly afterwards (a receiver woken from another thread was lost
    and took the worker's whole run down when cancelled)."""
    left, right = socket.socketpair()
    worker = Channel(right)
    left.setblocking(False)
    peer = trio.socket.from_stdlib_socket(left)

    async def ignore(message: Message) -> Message | None:
        return None

    async with trio.open_nursery() as nursery:
        nursery.start_soon(worker.run, ignore)
        await trio.testing.wait_all_tasks_blocked()  # the outbox's drain is waiting for a frame
        for n in range(3):
            await trio.to_thread.run_sync(worker.notify, {"type": "event", "n": n})
        decoder = FrameDecoder()
        got: list[Message] = []
        with trio.fail_after(5):
            while len(got) < 3:
                got.extend(decoder.feed(await peer.recv(65536)))
        assert got == [{"type": "event", "n": n} for n in range(3)]
        assert worker.dropped == 0
        nursery.cancel_scope.cancel()  # the drain's wait is cancelled: it must still be trio's to cancel
    peer.close()
    right.close()


async def test_flush_returns_once_every_queued_notification_is_written() -> None:
    """A worker told to end flushes, then its channel goes: every event queued before reaches the primary."""
    left, right = socket.socketpair()
    worker = Channel(right)
    got: list[Message] = []
    decoder = FrameDecoder()

    async def ignore(message: Message) -> Message | None:
        return None

    async def read_to_the_end() -> None:
        peer = trio.socket.from_stdlib_socket(left)
        while data := await peer.recv(65536):
            got.extend(decoder.feed(data))

    async with trio.open_nursery() as reading:
        reading.start_soon(read_to_the_end)
        async with trio.open_nursery() as running:
            running.start_soon(worker.run, ignore)
            for n in range(2000):  # ~80 KB of frames: more than the socket pair's buffer takes at once
                worker.notify({"type": "event", "n": n, "pad": "x" * 20})
            with trio.fail_after(10):
                await worker.flush()
            running.cancel_scope.cancel()  # then the worker's end goes at once, as its process would
        right.close()
    assert worker.dropped == 0
    assert [m["n"] for m in got] == list(range(2000))
    left.close()


def test_a_workers_events_are_recorded_by_the_primary_as_built() -> None:
    worker_log = JsonLog("control", sandbox="s", to_stream=False)
    sent: list[Event] = []
    worker_log.sink = sent.append
    worker_log.fields = {"worker": 1}
    worker_log.emit(EventName.LINK_UP, alpn="openshell-egress/1")

    out = io.StringIO()
    primary_log = JsonLog("control", sandbox="s", stream=out)
    taps: list[Event] = []
    primary_log.tap = taps.append
    primary_log.forward(Event.from_wire(sent[0].to_wire()))
    line = json.loads(out.getvalue())
    assert line["worker"] == 1 and line["event"] == "link.up" and line["alpn"] == "openshell-egress/1"
    assert taps[0].fields["worker"] == 1

"""FenceWatch's rules without a namespace: a notification triggers a re-read, only a changed fingerprint counts,
a failed re-read is retried, the timer re-reads with no notification at all."""

from __future__ import annotations

import socket

import trio
import trio.testing

from supervisor.boundary.capture.fence_watch import FenceWatch
from supervisor.boundary.capture.readback import FenceReadback


class Fake:
    def __init__(self) -> None:
        self.fingerprints: list[str | Exception] = []
        self.lost: list[FenceReadback] = []
        self.errors: list[str] = []

    async def inspect(self) -> FenceReadback:
        now = self.fingerprints.pop(0) if len(self.fingerprints) > 1 else self.fingerprints[0]
        if isinstance(now, Exception):
            raise now
        return FenceReadback(fingerprint=now, problems=() if now == "A" else ("unexpected link veth0 (veth)",))

    async def on_lost(self, report: FenceReadback) -> None:
        self.lost.append(report)


async def test_notification_with_unchanged_fingerprint_is_only_a_reread() -> None:
    fake = Fake()
    fake.fingerprints = ["A"]
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    ours.setblocking(False)
    watch = FenceWatch(expected="A", inspect=fake.inspect, on_lost=fake.on_lost, on_error=fake.errors.append,
                       notifications=ours, interval_s=3600)  # fmt: skip
    async with trio.open_nursery() as nursery:
        await nursery.start(watch.run)
        for count in (1, 2):
            theirs.send(b"rtm_newlink")
            with trio.fail_after(5):
                while watch.reads < count:  # noqa: ASYNC110 - polls the watch's own counter
                    await trio.sleep(0.01)
        assert fake.lost == []
        fake.fingerprints = ["B"]
        theirs.send(b"rtm_newlink")
        with trio.fail_after(5):
            while not fake.lost:  # noqa: ASYNC110
                await trio.sleep(0.01)
    assert fake.lost[0].fingerprint == "B" and len(fake.lost) == 1  # reported once; the watch ended
    theirs.close()


async def test_timer_rereads_and_a_failed_read_is_retried(autojump_clock: trio.testing.MockClock) -> None:
    fake = Fake()
    fake.fingerprints = [OSError("launcher busy"), "A", "C"]
    watch = FenceWatch(expected="A", inspect=fake.inspect, on_lost=fake.on_lost, on_error=fake.errors.append,
                       interval_s=5.0)  # fmt: skip
    started = trio.current_time()
    await watch.run()  # returns once the loss is reported
    assert watch.reads == 3 and fake.errors == ["OSError: launcher busy"]
    assert fake.lost[0].fingerprint == "C"
    assert trio.current_time() - started == 15.0
    assert fake.lost[0].trigger == "timer"


async def test_any_of_several_sockets_triggers_and_the_loss_says_so() -> None:
    """rtnetlink and nftables notifications are two sockets: a message on either one is a re-read."""
    fake = Fake()
    fake.fingerprints = ["A"]
    pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM) for _ in range(2)]
    for ours, _ in pairs:
        ours.setblocking(False)
    watch = FenceWatch(expected="A", inspect=fake.inspect, on_lost=fake.on_lost, on_error=fake.errors.append,
                       notifications=[ours for ours, _ in pairs], interval_s=3600)  # fmt: skip
    async with trio.open_nursery() as nursery:
        await nursery.start(watch.run)
        pairs[0][1].send(b"rtm_newlink")
        with trio.fail_after(5):
            while watch.reads < 1:  # noqa: ASYNC110 - polls the watch's own counter
                await trio.sleep(0.01)
        fake.fingerprints = ["B"]
        pairs[1][1].send(b"nft_msg_newrule")
        with trio.fail_after(5):
            while not fake.lost:  # noqa: ASYNC110
                await trio.sleep(0.01)
    assert fake.lost[0].trigger == "notification" and watch.reads == 2
    assert all(ours.fileno() == -1 for ours, _ in pairs)  # the watch closed its sockets
    for _, theirs in pairs:
        theirs.close()

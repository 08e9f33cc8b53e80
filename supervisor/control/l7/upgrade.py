"""After a ``101 Switching Protocols``: relay raw bytes both ways, through the websocket frame filter if any.

The first side to end (EOF, failure, or idle: no byte either way for the connection's ``IdleClock`` timeout —
a server that keeps talking to a silent client is not idle) ends the relay; the
caller then closes (or, after a failure, resets) both streams. TLS streams have no half-close, so "one side
ended" cannot be forwarded as EOF the way ``supervisor.link.relay`` does for TCP.
"""

from __future__ import annotations

from dataclasses import dataclass

import trio

from supervisor.control.l7.idle import IdleClock
from supervisor.control.l7.record import InspectStats
from supervisor.control.l7.websocket import ClientFrameFilter

__all__ = ["UpgradeEnd", "relay_upgraded"]

_STREAM_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)


@dataclass
class UpgradeEnd:
    first: str = "cancelled"  # "agent" / "upstream" (EOF), "idle", "filter", or "<side>: <error type>"
    clean: bool = True

    @property
    def failed(self) -> bool:
        return ":" in self.first


async def relay_upgraded(
    agent: trio.abc.Stream,
    upstream: trio.abc.Stream,
    *,
    frames: ClientFrameFilter | None,
    idle: IdleClock,
    chunk: int,
    stats: InspectStats,
) -> UpgradeEnd:
    end = UpgradeEnd()
    ended = False

    async def pump(src: trio.abc.Stream, dst: trio.abc.Stream, src_name: str, dst_name: str,
                   scope: trio.CancelScope) -> None:  # fmt: skip
        nonlocal ended
        receiving = True
        outcome = "cancelled"
        try:
            while True:
                receiving = True
                with idle.guard() as waited:
                    data = await src.receive_some(chunk)
                if waited.cancelled_caught:
                    outcome = "idle"
                    break
                if not data:
                    outcome = src_name
                    break
                idle.touch()
                receiving = False
                if src_name == "agent":
                    if frames is not None:
                        data = frames.feed(data)
                    stats.bytes_up += len(data)
                else:
                    stats.bytes_down += len(data)
                if data:
                    with idle.guard() as waited:
                        await dst.send_all(data)
                    if waited.cancelled_caught:
                        outcome = "idle"
                        break
                    idle.touch()
                if frames is not None and frames.stopped is not None:
                    outcome = "filter"
                    break
        except _STREAM_ERRORS as exc:
            outcome = f"{src_name if receiving else dst_name}: {type(exc).__name__}"
            end.clean = False
        if not ended:
            ended = True
            end.first = outcome
        scope.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(pump, agent, upstream, "agent", "upstream", nursery.cancel_scope)
        nursery.start_soon(pump, upstream, agent, "upstream", "agent", nursery.cancel_scope)
    return end

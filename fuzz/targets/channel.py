"""The exec stream's channel framing (``supervisor.protocol.channel``), both directions.

The first byte picks the direction the decoder reads (to the boundary, to the client, either) and how the rest
is split into reads. Oracles beyond "no crash":

* the decoder yields events, ``NEED_DATA``/``CLOSED`` or raises ``ChannelProtocolError``, nothing else; once it
  has raised it keeps raising;
* how the bytes are split into reads changes nothing: same events, same end;
* every event round-trips: ``decode(encode(event)) == event``, and a frame without JSON re-encodes to its own
  bytes.
"""

from __future__ import annotations

from typing import cast

from supervisor.protocol.channel import (
    CLOSED,
    NEED_DATA,
    ChannelDecoder,
    ChannelProtocolError,
    Direction,
    Error,
    Event,
    Exit,
    encode_frame,
)

_DIRECTIONS = (Direction.TO_BOUNDARY, Direction.TO_CLIENT, None)


def _decode(data: bytes, direction: Direction | None, step: int) -> tuple[list[Event], str]:
    decoder = ChannelDecoder(direction)
    events: list[Event] = []
    pieces = [data[i : i + step] for i in range(0, len(data), step)] + [b""]
    for piece in pieces:
        decoder.receive_data(piece)
        while True:
            try:
                got = decoder.next_frame()
            except ChannelProtocolError:
                try:
                    decoder.next_frame()
                except ChannelProtocolError:
                    return events, "error"
                raise AssertionError("the decoder recovered after an error") from None
            if got is NEED_DATA:
                break
            if got is CLOSED:
                return events, "closed"
            events.append(cast(Event, got))
    raise AssertionError("no end after the end of stream")


def _same(a: Event, b: Event) -> bool:
    if isinstance(a, Error) and isinstance(b, Error):
        return a.error.to_json() == b.error.to_json()
    return a == b


def one_input(data: bytes) -> None:
    if not data:
        return
    direction = _DIRECTIONS[data[0] % 3]
    step = 1 + (data[0] >> 2) % 7
    body = data[1:]
    events, end = _decode(body, direction, len(body) + 1)
    split_events, split_end = _decode(body, direction, step)
    assert end == split_end and len(events) == len(split_events), (end, split_end)
    assert all(_same(a, b) for a, b in zip(events, split_events, strict=True))
    offset = 0
    for event in events:
        wire = encode_frame(event)
        again, how = _decode(wire, direction, len(wire) + 1)
        assert how == "closed" and len(again) == 1 and _same(again[0], event), (event, again)
        length = int.from_bytes(body[offset + 1 : offset + 5], "big")
        original = body[offset : offset + 5 + length]
        offset += 5 + length
        if not isinstance(event, Exit | Error):
            assert wire == original, (wire, original)

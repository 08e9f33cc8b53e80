"""The tar stream of ``cp``, both ways, sans-I/O: a reader for archives the workload sends (the agent's bytes) and
the headers of the archives we send it.

Rules of the reader (what comes from the workload is written by a process the agent can ptrace, replace the
output of, or feed a sparse terabyte: every byte is hostile):

1. Bytes in, events out: :class:`Member` (a header, already checked), :class:`Data`, :class:`MemberEnd`; the end
   of the archive is a zero block. Nothing is buffered beyond one 512-byte block and one extended header.
2. Extended headers (pax ``x``, GNU ``L`` long names) are read only up to :data:`MAX_EXTENDED` bytes; pax ``g``
   headers are skipped within the same bound. A larger one is a :class:`ArchiveError`: a header that size is never
   one tar wrote for a real name.
3. A member's name is checked before anything is done with it: relative, no ``..`` component, no NUL, at most
   :data:`MAX_NAME` bytes; ``.`` components and repeated slashes are dropped. A name that fails is still a member
   (its data is skipped) with ``refused`` saying why, so the copy can go on and report it.
4. Only regular files and directories are members to write; every other type (symbolic and hard links, character
   and block devices, FIFOs, sparse and contiguous files, unknown types) is a member with ``refused`` set.
5. A malformed header (bad checksum, a non-numeric size, a negative size) ends the archive with an
   :class:`ArchiveError`.
"""

from __future__ import annotations

import tarfile
from dataclasses import dataclass
from typing import Final

__all__ = [
    "BLOCK",
    "MAX_EXTENDED",
    "MAX_NAME",
    "ArchiveError",
    "ArchiveReader",
    "Data",
    "Member",
    "MemberEnd",
    "check_name",
    "end_of_archive",
    "member_header",
    "padding",
]

BLOCK: Final = 512
MAX_EXTENDED: Final = 64 * 1024
MAX_NAME: Final = 4096
MAX_DEPTH: Final = 256

_KINDS: Final = {
    tarfile.SYMTYPE: "symbolic link",
    tarfile.LNKTYPE: "hard link",
    tarfile.CHRTYPE: "character device",
    tarfile.BLKTYPE: "block device",
    tarfile.FIFOTYPE: "FIFO",
    tarfile.CONTTYPE: "contiguous file",
    tarfile.GNUTYPE_SPARSE: "sparse file",
}


class ArchiveError(ValueError):
    """The stream is not a tar archive we read (or exceeds a bound of the format's own)."""


@dataclass(frozen=True)
class Member:
    name: str  # as in the archive (escaped for a terminal by whoever prints it)
    parts: tuple[str, ...]  # the checked path below the destination; empty when refused
    kind: str  # "file", "directory", or what it is when refused
    mode: int
    size: int
    refused: str | None = None


@dataclass(frozen=True)
class Data:
    data: bytes


@dataclass(frozen=True)
class MemberEnd:
    pass


Event = Member | Data | MemberEnd


def check_name(name: str) -> tuple[tuple[str, ...], str | None]:
    """Rule 3: the components of ``name`` below the destination, or ``()`` and why not."""
    if "\x00" in name:
        return (), "the name holds a NUL"
    if len(name.encode("utf-8", "surrogateescape")) > MAX_NAME:
        return (), f"the name is longer than {MAX_NAME} bytes"
    if name.startswith("/"):
        return (), "an absolute name"
    parts = tuple(part for part in name.split("/") if part not in ("", "."))
    if ".." in parts:
        return (), "a name with a '..' component"
    if not parts:
        return (), "an empty name"
    if len(parts) > MAX_DEPTH:
        return (), f"more than {MAX_DEPTH} levels deep"
    return parts, None


def _pax_records(payload: bytes) -> dict[str, str]:
    """``LEN key=value\\n`` records; a malformed one is an ArchiveError."""
    records: dict[str, str] = {}
    at = 0
    while at < len(payload):
        if payload[at:].strip(b"\x00") == b"":
            break
        space = payload.find(b" ", at)
        if space < 0 or not payload[at:space].isdigit():
            raise ArchiveError("malformed pax record")
        length = int(payload[at:space])
        record = payload[at : at + length]
        if length <= space - at or len(record) != length or not record.endswith(b"\n") or b"=" not in record:
            raise ArchiveError("malformed pax record")
        key, _, value = record[space - at + 1 : -1].partition(b"=")
        records[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        at += length
    return records


class ArchiveReader:
    """Rules 1-5: feed the stream's bytes, collect its events."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._remaining = 0  # data bytes of the current member still to come
        self._pad = 0  # padding after them
        self._extended: tuple[bytes, int] | None = None  # the extended header's type and size, while reading it
        self._pax: dict[str, str] = {}
        self._long_name: str | None = None
        self.ended = False

    def feed(self, data: bytes) -> list[Event]:
        events: list[Event] = []
        self._buffer += data
        while not self.ended:
            if self._remaining:
                take = min(self._remaining, len(self._buffer))
                if not take:
                    break
                events.append(Data(bytes(self._buffer[:take])))
                del self._buffer[:take]
                self._remaining -= take
                if not self._remaining:
                    events.append(MemberEnd())
                continue
            if self._pad:
                take = min(self._pad, len(self._buffer))
                del self._buffer[:take]
                self._pad -= take
                if self._pad:
                    break
                continue
            if self._extended is not None:
                if not self._read_extended():
                    break
                continue
            if len(self._buffer) < BLOCK:
                break
            block = bytes(self._buffer[:BLOCK])
            del self._buffer[:BLOCK]
            if block == bytes(BLOCK):
                self.ended = True  # what follows (a second zero block, the record's padding) is never read
                break
            events.extend(self._header(block))
        return events

    def _read_extended(self) -> bool:
        assert self._extended is not None
        kind, size = self._extended
        stored = size + padding(size)
        if len(self._buffer) < stored:
            return False
        payload = bytes(self._buffer[:size])
        del self._buffer[:stored]
        self._extended = None
        if kind == tarfile.XHDTYPE:
            self._pax = _pax_records(payload)
        elif kind == tarfile.GNUTYPE_LONGNAME:
            self._long_name = payload.split(b"\x00", 1)[0].decode("utf-8", "surrogateescape")
        return True

    def _header(self, block: bytes) -> list[Event]:
        try:
            info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
        except tarfile.HeaderError as exc:
            raise ArchiveError(f"malformed header: {exc}") from None
        size = info.size
        if size < 0:
            raise ArchiveError("a negative size")
        if info.type in (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK):
            if size > MAX_EXTENDED:
                raise ArchiveError(f"an extended header of {size} bytes (at most {MAX_EXTENDED})")
            self._extended = (info.type, size)
            return []
        pax, self._pax = self._pax, {}
        long_name, self._long_name = self._long_name, None
        name = pax.get("path", long_name if long_name is not None else info.name)
        if "size" in pax:
            if not pax["size"].isdigit():
                raise ArchiveError("a pax size that is not a number")
            size = int(pax["size"])
        refused: str | None = None
        if info.type in (tarfile.REGTYPE, tarfile.AREGTYPE):
            kind = "file"
        elif info.type == tarfile.DIRTYPE:
            kind = "directory"  # data a directory header declares is skipped
        else:
            kind = _KINDS.get(info.type, f"type {info.type!r}")
            refused = f"a {kind}"
        if any(key.startswith("GNU.sparse") for key in pax):
            kind, refused = "sparse file", "a sparse file"
        parts, problem = check_name(name)
        refused = refused or problem
        member = Member(name, () if refused else parts, kind, info.mode & 0o7777, size, refused)
        self._remaining, self._pad = size, padding(size)
        return [member] if size else [member, MemberEnd()]


def padding(size: int) -> int:
    return -size % BLOCK


def member_header(name: str, *, directory: bool, mode: int, size: int, mtime: int) -> bytes:
    """One pax header for a member we send: owner 0, the mode masked to permission bits."""
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE if directory else tarfile.REGTYPE
    info.mode = mode & 0o777
    info.size = 0 if directory else size
    info.mtime = max(0, mtime)
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def end_of_archive() -> bytes:
    return bytes(2 * BLOCK)

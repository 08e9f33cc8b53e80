"""The host side of ``cp`` into the workload: a tar stream of the source, read the way extraction writes
(``copy_extract`` rules, docs/design.md "Files in and out").

The source may lie in the agent's workdir, which the agent changes while ``cp`` (perhaps as root) reads it: a
file swapped for a symbolic link to a host secret between a check and an open would carry that secret into the
sandbox. Rules:

1. The tree is walked through directory descriptors; every entry is looked at without following it
   (``fstatat(AT_SYMLINK_NOFOLLOW)``), then opened with ``O_NOFOLLOW | O_NONBLOCK`` (a FIFO swapped in never blocks
   the open) and taken only when the open file is the same inode of the same type.
2. Regular files and directories only: symbolic links, devices, FIFOs and sockets are refused and reported, never
   opened. A file with several names is sent once per name, as a file (never a link member).
3. Modes are sent as permission bits only (no set-id), owner 0; a file is sent with the size it had when opened
   (a file that shrinks meanwhile is padded with zeros and reported, one that grows is cut there).
4. Bounds: the bytes sent and the members (``Limits``), else :class:`CopyLimit`.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final

from supervisor.cli.copy_archive import end_of_archive, member_header, padding
from supervisor.cli.copy_extract import CopyLimit, Limits
from supervisor.cli.human import clean

__all__ = ["Packer"]

CHUNK: Final = 256 * 1024


@dataclass
class Packer:
    limits: Limits = field(default_factory=Limits)
    refused: list[str] = field(default_factory=list)
    sent: int = 0
    members: int = 0

    def stream(self, parent: int, name: str, top: str) -> Iterator[bytes]:
        """The archive of ``name`` in the directory ``parent``, its first component renamed ``top``."""
        yield from self._entry(parent, name, top)
        yield self._count(end_of_archive())

    def _count(self, data: bytes) -> bytes:
        self.sent += len(data)
        if self.sent > self.limits.max_bytes:
            raise CopyLimit(f"the source is larger than {self.limits.max_bytes} bytes (--max-bytes)")
        return data

    def _entry(self, parent: int, name: str, path: str) -> Iterator[bytes]:
        try:
            before = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except OSError as exc:
            self.refused.append(f"{clean(path)}: not read: {exc.strerror}")
            return
        kind = stat.S_IFMT(before.st_mode)
        if kind not in (stat.S_IFREG, stat.S_IFDIR):
            self.refused.append(f"{clean(path)}: refused, {_kind(kind)}")
            return
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=parent)
        except OSError as exc:
            self.refused.append(f"{clean(path)}: not read: {exc.strerror}")
            return
        try:
            now = os.fstat(fd)
            if (now.st_dev, now.st_ino, stat.S_IFMT(now.st_mode)) != (before.st_dev, before.st_ino, kind):
                self.refused.append(f"{clean(path)}: refused, it changed while it was read")
                return
            self.members += 1
            if self.members > self.limits.max_members:
                raise CopyLimit(f"the source has more than {self.limits.max_members} entries (--max-files)")
            mtime = int(now.st_mtime)
            if kind == stat.S_IFDIR:
                yield self._count(member_header(path, directory=True, mode=now.st_mode, size=0, mtime=mtime))
                for child in sorted(os.listdir(fd)):
                    yield from self._entry(fd, child, f"{path}/{child}")
            else:
                yield from self._file(fd, path, now.st_size, now.st_mode, mtime)
        finally:
            os.close(fd)

    def _file(self, fd: int, path: str, size: int, mode: int, mtime: int) -> Iterator[bytes]:
        yield self._count(member_header(path, directory=False, mode=mode, size=size, mtime=mtime))
        left = size
        while left:
            data = os.read(fd, min(CHUNK, left))
            if not data:
                self.refused.append(f"{clean(path)}: shrank while it was read (padded with zeros)")
                data = bytes(min(CHUNK, left))
            left -= len(data)
            yield self._count(data)
        if pad := padding(size):
            yield self._count(bytes(pad))


def _kind(kind: int) -> str:
    return {
        stat.S_IFLNK: "a symbolic link",
        stat.S_IFCHR: "a character device",
        stat.S_IFBLK: "a block device",
        stat.S_IFIFO: "a FIFO",
        stat.S_IFSOCK: "a socket",
    }.get(kind, "not a regular file or directory")

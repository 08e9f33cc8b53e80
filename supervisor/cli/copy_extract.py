"""The host side of ``cp`` out of the workload: the archive's members written below the destination, and nowhere
else (docs/design.md "Files in and out").

What comes out of the workload is the agent's bytes, and ``cp`` may run as root. Rules:

1. Everything is written through directory descriptors: each path is walked from the destination's descriptor
   one component at a time with ``openat(O_DIRECTORY | O_NOFOLLOW)``, so an existing symbolic link anywhere below
   the destination (or one the archive names) is never followed: the member is refused.
2. Only the archive's checked members are written (``copy_archive`` rules 3-4): regular files and directories.
   The first component must be the one asked for (renamed to the local name); anything else is refused.
3. A file is written to a fresh name (``O_CREAT | O_EXCL | O_NOFOLLOW``) and renamed over the final one when
   complete, so an existing file (or a link) in its place is replaced, never written through; an unfinished file
   is removed.
4. Modes are the permission bits only (no set-id, no sticky), less the umask; owner and group are whoever runs
   ``cp`` (no ``chown``, whatever the archive says); times are the copy's.
5. Bounds: bytes of the stream and members; past either the copy stops (:class:`CopyLimit`). The time bound is
   the caller's.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from dataclasses import dataclass, field
from typing import Final

from supervisor.cli.copy_archive import ArchiveError, ArchiveReader, Data, Member, MemberEnd
from supervisor.cli.human import clean

__all__ = ["CopyLimit", "Extractor", "Limits", "open_directory"]

DEFAULT_MAX_BYTES: Final = 1 << 30
DEFAULT_MAX_MEMBERS: Final = 100_000
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class CopyLimit(Exception):
    """A bound of the copy was reached (rule 5)."""


@dataclass(frozen=True)
class Limits:
    max_bytes: int = DEFAULT_MAX_BYTES
    max_members: int = DEFAULT_MAX_MEMBERS


def open_directory(name: str, dir_fd: int | None = None) -> int:
    """An existing directory, never through a symbolic link as its last component."""
    return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)


@dataclass
class _Open:
    parent: int
    temporary: str
    final: str
    fd: int


@dataclass
class Extractor:
    """Feed it the stream; ``refused`` lists what was not written and why, for the caller to print."""

    root: int  # the destination directory's descriptor (the caller's, left open)
    top: tuple[str, str]  # the archive's first component, and the local name it becomes
    limits: Limits = field(default_factory=Limits)
    refused: list[str] = field(default_factory=list)
    files: int = 0
    directories: int = 0
    received: int = 0
    _reader: ArchiveReader = field(default_factory=ArchiveReader)
    _members: int = 0
    _open: _Open | None = None
    _skipping: bool = False

    def feed(self, data: bytes) -> None:
        self.received += len(data)
        if self.received > self.limits.max_bytes:
            raise CopyLimit(f"the archive is larger than {self.limits.max_bytes} bytes (--max-bytes)")
        for event in self._reader.feed(data):
            if isinstance(event, Member):
                self._member(event)
            elif isinstance(event, Data):
                self._data(event.data)
            elif isinstance(event, MemberEnd):
                self._end()

    def finish(self) -> None:
        """The stream ended: it must have ended as an archive does."""
        if not self._reader.ended:
            raise ArchiveError("the archive ended early")

    def abort(self) -> None:
        """Remove the file being written, if any (rule 3)."""
        if self._open is not None:
            current, self._open = self._open, None
            os.close(current.fd)
            _unlink(current.parent, current.temporary)
            os.close(current.parent)

    def _refuse(self, name: str, why: str) -> None:
        self.refused.append(f"{clean(name)}: {why}")
        self._skipping = True

    def _member(self, member: Member) -> None:
        self._members += 1
        if self._members > self.limits.max_members:
            raise CopyLimit(f"the archive has more than {self.limits.max_members} members (--max-files)")
        self._skipping = False
        if member.refused is not None:
            return self._refuse(member.name, f"refused, {member.refused}")
        if member.parts[0] != self.top[0]:
            return self._refuse(member.name, "refused, outside the path asked for")
        parts = (self.top[1], *member.parts[1:])
        try:
            parent = self._parent(parts[:-1])
        except OSError as exc:
            return self._refuse(member.name, _why(exc))
        try:
            if member.kind == "directory":
                self._directory(parent, parts[-1], member.mode)
                self.directories += 1
                os.close(parent)
            else:
                temporary = f".osb-cp-{secrets.token_hex(6)}"
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                fd = os.open(temporary, flags, member.mode & 0o777, dir_fd=parent)
                self._open = _Open(parent, temporary, parts[-1], fd)
        except OSError as exc:
            os.close(parent)
            self._refuse(member.name, _why(exc))

    def _parent(self, parts: tuple[str, ...]) -> int:
        """The directory holding a member: walked with O_NOFOLLOW, missing levels made (0755 less the umask)."""
        fd = os.dup(self.root)
        try:
            for part in parts:
                try:
                    child = open_directory(part, fd)
                except FileNotFoundError:
                    os.mkdir(part, 0o755, dir_fd=fd)
                    child = open_directory(part, fd)
                os.close(fd)
                fd = child
        except BaseException:
            os.close(fd)
            raise
        return fd

    @staticmethod
    def _directory(parent: int, name: str, mode: int) -> None:
        try:
            os.mkdir(name, (mode & 0o777) | 0o700, dir_fd=parent)
        except FileExistsError:
            if not stat.S_ISDIR(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
                raise OSError(errno.ENOTDIR, "exists and is not a directory") from None

    def _data(self, data: bytes) -> None:
        if self._open is None:
            return  # a refused member's or a directory's: skipped
        view = memoryview(data)
        while view:
            view = view[os.write(self._open.fd, view) :]

    def _end(self) -> None:
        if self._open is None:
            return
        current, self._open = self._open, None
        try:
            os.close(current.fd)
            os.rename(current.temporary, current.final, src_dir_fd=current.parent, dst_dir_fd=current.parent)
            self.files += 1
        except OSError as exc:
            _unlink(current.parent, current.temporary)
            self.refused.append(f"{clean(current.final)}: {_why(exc)}")
        finally:
            os.close(current.parent)


def _unlink(parent: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=parent)
    except OSError:
        pass


def _why(exc: OSError) -> str:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        return "refused, a symbolic link or a non-directory on its path"
    return f"not written: {exc.strerror or exc}"

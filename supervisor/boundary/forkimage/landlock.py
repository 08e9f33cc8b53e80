"""Landlock for a workload process (docs/reference/boundary.md §2.1 f, §2.2 step 11), through raw syscalls.

Rules of this module:

1. Use the highest ABI the kernel offers: handle every filesystem right it knows, so a right we do not grant
   is denied rather than silently left open; ABI >= 6 also scopes signals and abstract UNIX sockets to the
   workload's own domain (it cannot signal the boundary, nor reach an abstract socket outside).
2. ``read_only`` paths get execute + read-file + read-dir; ``read_write`` paths get every handled right; a path
   that is a file (not a directory) gets only the file rights (the kernel refuses directory rights on files).
3. Paths are opened (``O_PATH``) by the caller: a fresh child *after* the uid drop, so a path the workload uid
   cannot reach is simply not granted; a spare exec-init, once, for itself and every command it starts (child.py
   ``SELF``), with the init's credentials, which may grant such a path and gives nothing by it —
   every access is still checked against the workload's uid, and Landlock only ever narrows what that allows. A
   missing path is skipped and noted.
4. ``hard_requirement`` turns any degradation (no Landlock, ABI < 2, a path that could not be opened, nothing
   left to grant) into an error; ``best_effort`` returns it as a note for the caller to report (invariant 3:
   no silent weakening); ``off`` does nothing.
5. A ruleset whose every requested path failed is never applied empty (that would deny the whole filesystem);
   with ``best_effort`` only the scopes are applied.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from dataclasses import dataclass
from typing import Final, Literal

from . import linux

CREATE_RULESET_VERSION: Final = 1 << 0
RULE_PATH_BENEATH: Final = 1

FS_EXECUTE: Final = 1 << 0
FS_WRITE_FILE: Final = 1 << 1
FS_READ_FILE: Final = 1 << 2
FS_READ_DIR: Final = 1 << 3
FS_REMOVE_DIR: Final = 1 << 4
FS_REMOVE_FILE: Final = 1 << 5
FS_MAKE_CHAR: Final = 1 << 6
FS_MAKE_DIR: Final = 1 << 7
FS_MAKE_REG: Final = 1 << 8
FS_MAKE_SOCK: Final = 1 << 9
FS_MAKE_FIFO: Final = 1 << 10
FS_MAKE_BLOCK: Final = 1 << 11
FS_MAKE_SYM: Final = 1 << 12
FS_REFER: Final = 1 << 13  # ABI 2
FS_TRUNCATE: Final = 1 << 14  # ABI 3
FS_IOCTL_DEV: Final = 1 << 15  # ABI 5

SCOPE_ABSTRACT_UNIX_SOCKET: Final = 1 << 0  # ABI 6
SCOPE_SIGNAL: Final = 1 << 1  # ABI 6

_ABI1_FS: Final = (1 << 13) - 1
FILE_RIGHTS: Final = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
READ_RIGHTS: Final = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
MIN_FS_ABI: Final = 2


@dataclass(frozen=True)
class LandlockSpec:
    read_only: tuple[str, ...]
    read_write: tuple[str, ...]
    mode: Literal["best_effort", "hard_requirement", "off"] = "best_effort"


def abi_version() -> int:
    """The kernel's Landlock ABI, 0 when Landlock is absent or disabled."""
    try:
        return linux.syscall(linux.SYS_LANDLOCK_CREATE_RULESET, None, 0, CREATE_RULESET_VERSION)
    except OSError as exc:
        if exc.errno in (errno.ENOSYS, errno.EOPNOTSUPP):
            return 0
        raise


def handled_fs(abi: int) -> int:
    """Every filesystem right ``abi`` knows (ABIs past the newest we know get that one's set)."""
    if abi < 1:
        return 0
    rights = _ABI1_FS
    if abi >= 2:
        rights |= FS_REFER
    if abi >= 3:
        rights |= FS_TRUNCATE
    if abi >= 5:
        rights |= FS_IOCTL_DEV
    return rights


def scopes(abi: int) -> int:
    return SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0


def _attr_size(abi: int) -> int:
    # struct landlock_ruleset_attr grew: fs (v1), +net (v4), +scoped (v6); pass only what the kernel knows.
    return 8 if abi < 4 else 16 if abi < 6 else 24


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class LandlockError(OSError):
    """A hard requirement that could not be met."""


@dataclass
class _Ruleset:
    """A ruleset built (``_build``: every path opened and added) and not yet applied (``_enforce``)."""

    fd: int | None  # None: nothing to apply (``off``, Landlock missing and ``best_effort``)
    notes: tuple[str, ...]  # the degradations found while building it (rule 4)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _build(spec: LandlockSpec) -> _Ruleset:
    """The ruleset ``spec`` asks for, not yet applied; raises ``LandlockError`` on a degradation under
    ``hard_requirement`` (rule 4)."""
    if spec.mode == "off":
        return _Ruleset(None, ())
    hard = spec.mode == "hard_requirement"
    notes: list[str] = []

    def degrade(err: int, note: str) -> None:
        if hard:
            raise LandlockError(err, note)
        notes.append(note)

    abi = abi_version()
    if abi < 1:
        degrade(errno.EOPNOTSUPP, "landlock unavailable")
        return _Ruleset(None, tuple(notes))
    requested = spec.read_only + spec.read_write
    fs = handled_fs(abi) if requested else 0
    if fs and abi < MIN_FS_ABI:
        degrade(errno.EOPNOTSUPP, f"landlock ABI {abi} < {MIN_FS_ABI}: filesystem rules skipped")
        fs = 0
    rules: list[tuple[int, int]] = []
    try:
        if fs:
            for path, rights in [(p, READ_RIGHTS) for p in spec.read_only] + [(p, fs) for p in spec.read_write]:
                try:
                    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
                except OSError as exc:
                    if exc.errno == errno.ENOENT:
                        notes.append(f"landlock: {path} missing, not granted")
                    else:
                        degrade(exc.errno or errno.EINVAL, f"landlock: {path}: {exc.strerror}")
                    continue
                if not stat.S_ISDIR(os.fstat(fd).st_mode):
                    rights &= FILE_RIGHTS
                rules.append((fd, rights & fs))
            if not rules:
                degrade(errno.ENOENT, "landlock: no requested path could be granted; filesystem rules skipped")
                fs = 0
        scoped = scopes(abi)
        if not fs and not scoped:
            return _Ruleset(None, tuple(notes))
        attr = _RulesetAttr(fs, 0, scoped)
        ruleset = linux.syscall(
            linux.SYS_LANDLOCK_CREATE_RULESET, ctypes.c_void_p(ctypes.addressof(attr)), _attr_size(abi), 0
        )
        try:
            if fs:
                for fd, rights in rules:
                    beneath = _PathBeneath(rights, fd)
                    linux.syscall(
                        linux.SYS_LANDLOCK_ADD_RULE,
                        ruleset,
                        RULE_PATH_BENEATH,
                        ctypes.c_void_p(ctypes.addressof(beneath)),
                        0,
                    )
        except BaseException:
            os.close(ruleset)
            raise
        return _Ruleset(ruleset, tuple(notes))
    finally:
        for fd, _ in rules:
            os.close(fd)


def _enforce(ruleset: _Ruleset) -> None:
    """Apply a built ruleset to the calling thread (``no_new_privs`` first, or CAP_SYS_ADMIN)."""
    if ruleset.fd is not None:
        linux.syscall(linux.SYS_LANDLOCK_RESTRICT_SELF, ruleset.fd, 0)


def restrict_self(spec: LandlockSpec) -> list[str]:
    """Apply ``spec`` to the calling thread; return notes describing any best-effort degradation."""
    ruleset = _build(spec)
    try:
        _enforce(ruleset)
    finally:
        ruleset.close()
    return list(ruleset.notes)

"""Thin ctypes bindings for the Linux calls Python 3.11 does not wrap.

Rules of this module:

1. One function per kernel call, raising ``OSError(errno)`` on failure, never returning ``-1``.
2. No policy here: callers decide what a failure means.
3. Every argument handed to the variadic ``syscall(2)`` is wrapped in ``c_long`` so 64-bit values (pointers,
   flags) are never truncated to ``int``.

``os.unshare``/``os.setns`` arrived in 3.12; ``os.pidfd_open`` exists but ``pidfd_send_signal`` does not.
"""

from __future__ import annotations

import ctypes
import errno as _errno
import os
import platform
import sys
from collections.abc import Iterable
from typing import Final

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long

# --- clone(2)/unshare(2) flags -------------------------------------------------------------------------
CLONE_NEWNS: Final = 0x00020000
CLONE_NEWUSER: Final = 0x10000000
CLONE_NEWPID: Final = 0x20000000
CLONE_NEWNET: Final = 0x40000000

# --- mount(2) flags ------------------------------------------------------------------------------------
MS_RDONLY: Final = 0x1
MS_NOSUID: Final = 0x2
MS_NODEV: Final = 0x4
MS_NOEXEC: Final = 0x8
MS_REMOUNT: Final = 0x20
MS_NOATIME: Final = 0x400
MS_NODIRATIME: Final = 0x800
MS_BIND: Final = 0x1000
MS_REC: Final = 0x4000
MS_RELATIME: Final = 1 << 21
MS_STRICTATIME: Final = 1 << 24
MNT_DETACH: Final = 0x2
MS_PRIVATE: Final = 1 << 18
MS_SLAVE: Final = 1 << 19

# --- prctl(2) options ----------------------------------------------------------------------------------
PR_SET_PDEATHSIG: Final = 1
PR_SET_DUMPABLE: Final = 4
PR_SET_SECCOMP: Final = 22
PR_CAPBSET_READ: Final = 23
PR_CAPBSET_DROP: Final = 24
PR_SET_CHILD_SUBREAPER: Final = 36
PR_SET_NO_NEW_PRIVS: Final = 38
PR_GET_NO_NEW_PRIVS: Final = 39
PR_CAP_AMBIENT: Final = 47
PR_CAP_AMBIENT_RAISE: Final = 2
PR_CAP_AMBIENT_CLEAR_ALL: Final = 4

SECCOMP_MODE_FILTER: Final = 2

# --- capabilities --------------------------------------------------------------------------------------
CAP_SETGID: Final = 6
CAP_SETUID: Final = 7
CAP_SETPCAP: Final = 8
CAP_NET_ADMIN: Final = 12
CAP_SYS_ADMIN: Final = 21
CAP_SYS_NICE: Final = 23
_LINUX_CAPABILITY_VERSION_3: Final = 0x20080522

# Syscalls numbered alike on x86_64 and aarch64 (the unified table from 5.x on).
SYS_PIDFD_SEND_SIGNAL: Final = 424
SYS_CLOSE_RANGE: Final = 436
SYS_LANDLOCK_CREATE_RULESET: Final = 444
SYS_LANDLOCK_ADD_RULE: Final = 445
SYS_LANDLOCK_RESTRICT_SELF: Final = 446

MACHINE: Final = platform.machine()


def _check(result: int) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return result


def syscall(number: int, *args: int | ctypes.c_void_p | None) -> int:
    """Raw ``syscall(2)``; ints are passed as ``long``, ``None`` as NULL."""
    wrapped: list[ctypes.c_long | ctypes.c_void_p] = []
    for arg in args:
        if arg is None:
            wrapped.append(ctypes.c_void_p(0))
        elif isinstance(arg, ctypes.c_void_p):
            wrapped.append(arg)
        else:
            wrapped.append(ctypes.c_long(arg))
    return _check(int(_libc.syscall(ctypes.c_long(number), *wrapped)))


def unshare(flags: int) -> None:
    _check(_libc.unshare(ctypes.c_int(flags)))


def setns(fd: int, nstype: int = 0) -> None:
    _check(_libc.setns(ctypes.c_int(fd), ctypes.c_int(nstype)))


_prctl = _libc.prctl
_prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
_prctl.restype = ctypes.c_int
_prctl_ptr = _libc["prctl"]  # a second function object, so the pointer variant keeps its own argtypes
_prctl_ptr.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
_prctl_ptr.restype = ctypes.c_int


def prctl(option: int, arg2: int = 0, arg3: int = 0, arg4: int = 0, arg5: int = 0) -> int:
    return _check(_prctl(option, arg2, arg3, arg4, arg5))


def prctl_ptr(option: int, arg2: int, pointer: ctypes.c_void_p) -> int:
    """``prctl`` whose third argument is a pointer (``PR_SET_SECCOMP``)."""
    return _check(_prctl_ptr(option, arg2, pointer, 0, 0))


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    def enc(value: str | None) -> bytes | None:
        return None if value is None else os.fsencode(value)

    _check(
        _libc.mount(
            ctypes.c_char_p(enc(source)),
            ctypes.c_char_p(enc(target)),
            ctypes.c_char_p(enc(fstype)),
            ctypes.c_ulong(flags),
            ctypes.c_char_p(enc(data)),
        )
    )


def umount2(target: str, flags: int) -> None:
    _check(_libc.umount2(ctypes.c_char_p(os.fsencode(target)), ctypes.c_int(flags)))


# pivot_root has no glibc wrapper, and its number differs per architecture.
_SYS_PIVOT_ROOT: Final = {"x86_64": 155, "aarch64": 41}


def pivot_root(new_root: str, put_old: str) -> None:
    number = _SYS_PIVOT_ROOT.get(MACHINE)
    if number is None:
        raise OSError(_errno.ENOSYS, f"pivot_root: unknown architecture {MACHINE}")
    new, old = ctypes.c_char_p(os.fsencode(new_root)), ctypes.c_char_p(os.fsencode(put_old))
    syscall(number, ctypes.c_void_p(ctypes.cast(new, ctypes.c_void_p).value),
            ctypes.c_void_p(ctypes.cast(old, ctypes.c_void_p).value))  # fmt: skip


# rt_sigaction is not one of the unified syscall numbers above: it differs per architecture.
_SYS_RT_SIGACTION: Final = {"x86_64": 13, "aarch64": 134}


def reset_reserved_signals() -> None:
    """Set the two signals glibc keeps for itself (32, 33) back to SIG_DFL with the raw syscall.

    Python's ``signal`` module cannot name them, and an ignored disposition survives ``execve``: a parent that
    ignored one would hand that to the workload. Best effort on unknown architectures."""
    number = _SYS_RT_SIGACTION.get(MACHINE)
    if number is None:
        return
    action = (ctypes.c_ulong * 4)()  # struct kernel_sigaction: handler=SIG_DFL(0), flags, restorer, mask
    for sig in (32, 33):
        try:
            syscall(number, sig, ctypes.cast(action, ctypes.c_void_p), None, 8)
        except OSError:
            pass


_SIGSET_WORDS: Final = 1024 // (8 * ctypes.sizeof(ctypes.c_ulong))  # glibc's sigset_t
_SIGNALFD_SIGINFO: Final = 128  # sizeof(struct signalfd_siginfo); ssi_signo is its first u32


def signalfd(signals: Iterable[int]) -> int:
    """A new close-on-exec, non-blocking signalfd for ``signals`` (readable only while they are blocked)."""
    mask = (ctypes.c_ulong * _SIGSET_WORDS)()
    bits = 8 * ctypes.sizeof(ctypes.c_ulong)
    for sig in signals:
        mask[(sig - 1) // bits] |= 1 << ((sig - 1) % bits)
    return _check(_libc.signalfd(-1, ctypes.byref(mask), os.O_CLOEXEC | os.O_NONBLOCK))


def read_signals(fd: int) -> list[int]:
    """The signal numbers a signalfd has pending now (taking them)."""
    taken: list[int] = []
    while True:
        try:
            data = os.read(fd, _SIGNALFD_SIGINFO * 16)
        except BlockingIOError:
            return taken
        if not data:
            return taken
        taken += [int.from_bytes(data[i : i + 4], sys.byteorder) for i in range(0, len(data), _SIGNALFD_SIGINFO)]


def close_range(first: int, last: int = 0xFFFFFFFF) -> None:
    """Close every fd in ``[first, last]``; falls back to ``os.closerange`` on old kernels."""
    try:
        syscall(SYS_CLOSE_RANGE, first, last, 0)
    except OSError as exc:
        if exc.errno != _errno.ENOSYS:
            raise
        os.closerange(first, min(last, os.sysconf("SC_OPEN_MAX")))


def pidfd_send_signal(pidfd: int, sig: int) -> None:
    syscall(SYS_PIDFD_SEND_SIGNAL, pidfd, sig, None, 0)


# --- capabilities via capget/capset ------------------------------------------------------------------
class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def capget() -> tuple[int, int, int]:
    """This thread's (effective, permitted, inheritable) capability masks as 64-bit ints."""
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    _check(_libc.capget(ctypes.byref(header), data))
    return (
        data[0].effective | (data[1].effective << 32),
        data[0].permitted | (data[1].permitted << 32),
        data[0].inheritable | (data[1].inheritable << 32),
    )


def capset_clear() -> None:
    """Empty the effective, permitted and inheritable sets of this thread."""
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    _check(_libc.capset(ctypes.byref(header), data))


def capset(effective: int, permitted: int, inheritable: int) -> None:
    """Set this thread's three capability masks (64-bit ints)."""
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    for index, shift in enumerate((0, 32)):
        data[index].effective = effective >> shift & 0xFFFFFFFF
        data[index].permitted = permitted >> shift & 0xFFFFFFFF
        data[index].inheritable = inheritable >> shift & 0xFFFFFFFF
    _check(_libc.capset(ctypes.byref(header), data))


def has_effective_cap(cap: int) -> bool:
    return bool(capget()[0] >> cap & 1)


def cap_last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap", "rb") as fh:
            return int(fh.read())
    except (OSError, ValueError):
        return 40


def pidfd_pid(pidfd: int, proc: str = "/proc", dir_fd: int | None = None) -> int:
    """The pid behind ``pidfd`` as seen by the procfs it is read through (``-1`` once reaped).

    ``dir_fd`` lets a process whose ``/proc`` shows another PID namespace read through an older procfs.
    """
    path = f"self/fdinfo/{pidfd}" if dir_fd is not None else f"{proc}/self/fdinfo/{pidfd}"
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        text = os.read(fd, 4096).decode()
    finally:
        os.close(fd)
    for line in text.splitlines():
        if line.startswith("Pid:"):
            return int(line.split()[1])
    raise OSError(_errno.ENOSYS, "no Pid: line in pidfd fdinfo")

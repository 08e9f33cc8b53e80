"""The connect-notify filter program, run through the seccomp tests' BPF interpreter."""

from __future__ import annotations

import errno

import pytest

from supervisor.boundary.capture import connect_notify
from supervisor.boundary.forkimage import seccomp
from supervisor.boundary.forkimage.seccomp import AUDIT_ARCH, RET_ALLOW, RET_ERRNO, RET_USER_NOTIF, SYSCALLS

from .test_launcher_seccomp import run_bpf

ARCHES = pytest.mark.parametrize("arch", sorted(AUDIT_ARCH))


@ARCHES
def test_connect_and_exec_wait_for_the_boundary(arch: str) -> None:
    program = seccomp.build(arch, seccomp.NOTIFY_RULES)
    for name in ("connect", "execve", "execveat"):
        assert run_bpf(program, SYSCALLS[arch][name], AUDIT_ARCH[arch], (3, 0, 0)) == RET_USER_NOTIF, name


@ARCHES
def test_fast_open_sends_are_refused_and_ordinary_sends_pass(arch: str) -> None:
    program = seccomp.build(arch, seccomp.NOTIFY_RULES)
    refuse = RET_ERRNO | errno.EOPNOTSUPP
    for name, flags_at in (("sendto", 3), ("sendmsg", 2), ("sendmmsg", 3)):
        nr = SYSCALLS[arch][name]
        args = [3, 0, 0, 0]
        assert run_bpf(program, nr, AUDIT_ARCH[arch], tuple(args)) == RET_ALLOW, name
        args[flags_at] = seccomp.MSG_FASTOPEN | 0x40  # with MSG_DONTWAIT too
        assert run_bpf(program, nr, AUDIT_ARCH[arch], tuple(args)) == refuse, name
        args[flags_at] = seccomp.MSG_FASTOPEN | 0xFFFF_FFFF_0000_0000  # high bits are ignored by the kernel
        assert run_bpf(program, nr, AUDIT_ARCH[arch], tuple(args)) == refuse, name


@ARCHES
def test_a_nested_listener_and_io_uring_are_refused(arch: str) -> None:
    program = seccomp.build(arch, seccomp.NOTIFY_RULES)
    eperm = RET_ERRNO | errno.EPERM
    nr = SYSCALLS[arch]["seccomp"]
    new_listener = seccomp.SECCOMP_FILTER_FLAG_NEW_LISTENER
    assert run_bpf(program, nr, AUDIT_ARCH[arch], (seccomp.SECCOMP_SET_MODE_FILTER, new_listener)) == eperm
    assert run_bpf(program, nr, AUDIT_ARCH[arch], (seccomp.SECCOMP_SET_MODE_FILTER, 0)) == RET_ALLOW
    for name in ("io_uring_setup", "io_uring_enter", "io_uring_register"):
        assert run_bpf(program, SYSCALLS[arch][name], AUDIT_ARCH[arch]) == eperm
    assert run_bpf(program, SYSCALLS[arch]["socket"], AUDIT_ARCH[arch], (2, 1, 0)) == RET_ALLOW


def test_ioctl_numbers_match_the_kernel_headers() -> None:
    # linux/seccomp.h: SECCOMP_IOWR(0, struct seccomp_notif), SECCOMP_IOWR(1, ...resp), SECCOMP_IOW(2, __u64)
    assert (connect_notify.NOTIF_RECV, connect_notify.NOTIF_SEND, connect_notify.NOTIF_ID_VALID) == (
        0xC0502100,
        0xC0182101,
        0x40082102,
    )

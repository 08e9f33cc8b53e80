"""The seccomp program, run through a small classic-BPF interpreter: what each syscall gets, per architecture.

The interpreter implements exactly the opcodes the assembler may emit and fails on any other, so a program
that grows an instruction we did not check here fails these tests rather than passing unexamined.
"""

from __future__ import annotations

import errno
import struct

import pytest

from supervisor.boundary.forkimage import linux, seccomp
from supervisor.boundary.forkimage.seccomp import (
    AUDIT_ARCH,
    RET_ALLOW,
    RET_ERRNO,
    RET_KILL_PROCESS,
    SYSCALLS,
)

EPERM = RET_ERRNO | errno.EPERM
ENOSYS = RET_ERRNO | errno.ENOSYS


def run_bpf(program: bytes, nr: int, arch: int, args: tuple[int, ...] = ()) -> int:
    """Evaluate a classic BPF seccomp program on one ``struct seccomp_data``."""
    full_args = (tuple(args) + (0,) * 6)[:6]
    data = struct.pack("<iIQ6Q", nr, arch, 0x400000, *full_args)
    insns = [struct.unpack("=HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    acc = 0
    pc = 0
    steps = 0
    while True:
        steps += 1
        assert steps < 10_000, "program loops"
        code, jt, jf, k = insns[pc]
        pc += 1
        if code == seccomp.BPF_LD_W_ABS:
            assert k % 4 == 0 and k + 4 <= len(data)
            acc = struct.unpack_from("<I", data, k)[0]
        elif code == seccomp.BPF_JEQ_K:
            pc += jt if acc == k else jf
        elif code == seccomp.BPF_JGE_K:
            pc += jt if acc >= k else jf
        elif code == seccomp.BPF_JSET_K:
            pc += jt if acc & k else jf
        elif code == seccomp.BPF_RET_K:
            return k
        else:
            raise AssertionError(f"unexpected opcode {code:#x}")
        assert 0 <= pc < len(insns), "jump out of the program"


UNCONDITIONAL = [
    "memfd_create",
    "ptrace",
    "bpf",
    "process_vm_readv",
    "process_vm_writev",
    "pidfd_open",
    "pidfd_getfd",
    "pidfd_send_signal",
    "io_uring_setup",
    "mount",
    "umount2",
    "pivot_root",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "move_mount",
    "open_tree",
    "mount_setattr",
    "setns",
    "userfaultfd",
    "perf_event_open",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "keyctl",
    "add_key",
    "request_key",
    "acct",
    "swapon",
    "swapoff",
    "reboot",
    "open_by_handle_at",
    "name_to_handle_at",
]

# (syscall, args, expected) — args are full 64-bit values as a caller could pass them.
CONDITIONAL = [
    ("clone3", (), ENOSYS),
    ("socket", (2, 1, 0), RET_ALLOW),  # AF_INET stream: the agent needs it to reach its capture listeners
    ("socket", (10, 2, 0), RET_ALLOW),  # AF_INET6 datagram
    ("socket", (1, 1, 0), RET_ALLOW),  # AF_UNIX
    ("socket", (17, 3, 0x300), EPERM),  # AF_PACKET
    ("socket", (31, 1, 0), EPERM),  # AF_BLUETOOTH
    ("socket", (40, 1, 0), EPERM),  # AF_VSOCK
    ("socket", (16, 3, 0), RET_ALLOW),  # AF_NETLINK / NETLINK_ROUTE (getifaddrs)
    ("socket", (16, 3, 9), EPERM),  # AF_NETLINK / NETLINK_AUDIT
    ("socket", (16, 3, 12), EPERM),  # AF_NETLINK / NETLINK_NETFILTER
    ("socket", (17 | (1 << 32), 3, 0), EPERM),  # high bits are ignored by the kernel for an int: still caught
    ("unshare", (linux.CLONE_NEWUSER,), EPERM),
    ("unshare", (linux.CLONE_NEWUSER | linux.CLONE_NEWNET,), EPERM),
    ("unshare", (linux.CLONE_NEWNS,), RET_ALLOW),  # harmless without capabilities; not on the list
    ("clone", (0x11 | linux.CLONE_NEWUSER,), EPERM),
    ("clone", (0x01200011,), RET_ALLOW),  # glibc fork()'s flags
    ("execveat", (3, 0, 0, 0, 0x1000), EPERM),  # AT_EMPTY_PATH: exec of an fd (memfd, O_PATH)
    ("execveat", (3, 0, 0, 0, 0x100), RET_ALLOW),  # AT_SYMLINK_NOFOLLOW alone
    ("seccomp", (1, 0, 0), EPERM),  # SECCOMP_SET_MODE_FILTER
    ("seccomp", (2, 0, 0), RET_ALLOW),  # SECCOMP_GET_ACTION_AVAIL
    ("prctl", (22, 2), EPERM),  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
    ("prctl", (22, 1), RET_ALLOW),  # strict mode only restricts further
    ("prctl", (15, 0), RET_ALLOW),  # PR_SET_NAME
]


@pytest.mark.parametrize("arch", sorted(AUDIT_ARCH))
@pytest.mark.parametrize("name", UNCONDITIONAL)
def test_unconditional_denials(arch: str, name: str) -> None:
    program = seccomp.build(arch)
    assert run_bpf(program, SYSCALLS[arch][name], AUDIT_ARCH[arch]) == EPERM


@pytest.mark.parametrize("arch", sorted(AUDIT_ARCH))
@pytest.mark.parametrize(("name", "args", "expected"), CONDITIONAL)
def test_conditional_rules(arch: str, name: str, args: tuple[int, ...], expected: int) -> None:
    program = seccomp.build(arch)
    assert run_bpf(program, SYSCALLS[arch][name], AUDIT_ARCH[arch], args) == expected


ORDINARY = {
    "x86_64": {"read": 0, "write": 1, "openat": 257, "execve": 59, "kill": 62, "connect": 42, "exit_group": 231},
    "aarch64": {"read": 63, "write": 64, "openat": 56, "execve": 221, "kill": 129, "connect": 203, "exit_group": 94},
}


@pytest.mark.parametrize("arch", sorted(AUDIT_ARCH))
def test_ordinary_syscalls_allowed(arch: str) -> None:
    program = seccomp.build(arch)
    for nr in ORDINARY[arch].values():
        assert run_bpf(program, nr, AUDIT_ARCH[arch]) == RET_ALLOW


@pytest.mark.parametrize("arch", sorted(AUDIT_ARCH))
def test_foreign_architecture_is_killed(arch: str) -> None:
    program = seccomp.build(arch)
    i386 = 0x40000003
    for foreign in (i386, *[a for name, a in AUDIT_ARCH.items() if name != arch]):
        assert run_bpf(program, 0, foreign) == RET_KILL_PROCESS


def test_x32_numbers_refused_on_x86_64() -> None:
    program = seccomp.build("x86_64")
    x32_memfd = seccomp.X32_SYSCALL_BIT | 319
    assert run_bpf(program, x32_memfd, AUDIT_ARCH["x86_64"]) == EPERM
    assert run_bpf(program, seccomp.X32_SYSCALL_BIT | 0, AUDIT_ARCH["x86_64"]) == EPERM


def test_tables_name_every_rule_on_every_arch() -> None:
    for arch, table in SYSCALLS.items():
        for rule in seccomp.DENY_RULES:
            assert rule.syscall in table, (arch, rule.syscall)
        numbers = list(table.values())
        assert len(numbers) == len(set(numbers)), f"duplicate syscall number in the {arch} table"


def test_unknown_arch_refused() -> None:
    with pytest.raises(OSError) as info:
        seccomp.build("riscv64")
    assert info.value.errno == errno.ENOSYS


def test_program_shape() -> None:
    program = seccomp.build("x86_64")
    assert len(program) % 8 == 0
    assert len(program) // 8 < 255  # comfortably small; the kernel caps at 4096

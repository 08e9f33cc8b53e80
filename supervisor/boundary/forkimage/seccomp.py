"""The workload's seccomp deny list, hand-assembled as classic BPF (docs/reference/boundary.md §2.1 g, §2.2 step 12).

Rules of this module:

1. Default allow; every rule below returns an errno (``EPERM``, or ``ENOSYS`` for ``clone3`` so glibc falls
   back to ``clone``, whose flags a filter can see).
2. The architecture is checked first: a syscall made through another ABI (i386 ``int 0x80`` on x86_64, or
   any foreign ``AUDIT_ARCH``) kills the process, and x32 numbers (bit 30 set) are refused on x86_64.
   Otherwise a number from one table could mean a different call in another.
3. Argument tests look at the low 32 bits only. Every argument tested is an ``int`` or has its tested bits in
   the low word (``CLONE_NEWUSER``), and the kernel ignores the high word of ``int`` arguments, so a test on
   all 64 bits could be dodged by setting high bits.
4. A rule is data: ``Rule(syscall, errno, when)`` where ``when`` is an OR of AND-ed argument tests; the
   assembler turns each rule into one self-contained block, so no jump crosses a rule and none can overflow.

Theory of operation: the program loads ``arch``, then ``nr``; for each rule it compares ``nr`` and, on a match,
evaluates the argument clauses, returning the rule's errno when one clause holds, then reloads ``nr`` and falls
through to the next rule. The last instruction allows.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import struct
from dataclasses import dataclass
from typing import Final, Literal

from . import linux

# --- classic BPF opcodes and seccomp return values --------------------------------------------------------
BPF_LD_W_ABS: Final = 0x20
BPF_JEQ_K: Final = 0x15
BPF_JGE_K: Final = 0x35
BPF_JSET_K: Final = 0x45
BPF_RET_K: Final = 0x06

RET_KILL_PROCESS: Final = 0x80000000
RET_ERRNO: Final = 0x00050000
RET_USER_NOTIF: Final = 0x7FC00000
RET_ALLOW: Final = 0x7FFF0000

OFF_NR: Final = 0
OFF_ARCH: Final = 4


def _arg_low(index: int) -> int:
    """Offset of the low word of ``args[index]`` in ``struct seccomp_data`` (both arches are little-endian)."""
    return 16 + 8 * index


AUDIT_ARCH: Final = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
X32_SYSCALL_BIT: Final = 0x40000000

# Syscall numbers, checked against the kernel headers (asm/unistd_64.h, asm-generic/unistd.h).
_COMMON: Final = {
    "pidfd_open": 434,
    "pidfd_getfd": 438,
    "pidfd_send_signal": 424,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "clone3": 435,
    "mount_setattr": 442,
    "open_tree_attr": 467,
}
SYSCALLS: Final[dict[str, dict[str, int]]] = {
    "x86_64": _COMMON
    | {
        "memfd_create": 319,
        "ptrace": 101,
        "bpf": 321,
        "process_vm_readv": 310,
        "process_vm_writev": 311,
        "mount": 165,
        "umount2": 166,
        "pivot_root": 155,
        "setns": 308,
        "userfaultfd": 323,
        "perf_event_open": 298,
        "kexec_load": 246,
        "kexec_file_load": 320,
        "init_module": 175,
        "finit_module": 313,
        "delete_module": 176,
        "keyctl": 250,
        "add_key": 248,
        "request_key": 249,
        "acct": 163,
        "swapon": 167,
        "swapoff": 168,
        "reboot": 169,
        "open_by_handle_at": 304,
        "name_to_handle_at": 303,
        "socket": 41,
        "execveat": 322,
        "unshare": 272,
        "clone": 56,
        "seccomp": 317,
        "prctl": 157,
        "connect": 42,
        "execve": 59,
        "sendto": 44,
        "sendmsg": 46,
        "sendmmsg": 307,
    },
    "aarch64": _COMMON
    | {
        "memfd_create": 279,
        "ptrace": 117,
        "bpf": 280,
        "process_vm_readv": 270,
        "process_vm_writev": 271,
        "mount": 40,
        "umount2": 39,
        "pivot_root": 41,
        "setns": 268,
        "userfaultfd": 282,
        "perf_event_open": 241,
        "kexec_load": 104,
        "kexec_file_load": 294,
        "init_module": 105,
        "finit_module": 273,
        "delete_module": 106,
        "keyctl": 219,
        "add_key": 217,
        "request_key": 218,
        "acct": 89,
        "swapon": 224,
        "swapoff": 225,
        "reboot": 142,
        "open_by_handle_at": 265,
        "name_to_handle_at": 264,
        "socket": 198,
        "execveat": 281,
        "unshare": 97,
        "clone": 220,
        "seccomp": 277,
        "prctl": 167,
        "connect": 203,
        "execve": 221,
        "sendto": 206,
        "sendmsg": 211,
        "sendmmsg": 269,
    },
}

AF_NETLINK: Final = 16
AF_PACKET: Final = 17
AF_BLUETOOTH: Final = 31
AF_VSOCK: Final = 40
AT_EMPTY_PATH: Final = 0x1000
SECCOMP_SET_MODE_FILTER: Final = 1


@dataclass(frozen=True)
class Arg:
    """One test on the low word of ``args[index]``: equal, not equal, or any bit of ``value`` set."""

    index: int
    op: Literal["eq", "ne", "set"]
    value: int


@dataclass(frozen=True)
class Rule:
    syscall: str
    errno: int = errno.EPERM
    when: tuple[tuple[Arg, ...], ...] = ()  # OR of AND-clauses; empty means always
    ret: int | None = None  # another seccomp return than RET_ERRNO | errno (the notify filter's RET_USER_NOTIF)


_UNCONDITIONAL: Final = (
    "memfd_create",
    "ptrace",
    "bpf",
    "process_vm_readv",
    "process_vm_writev",
    "pidfd_open",
    "pidfd_getfd",
    "pidfd_send_signal",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "mount",
    "umount2",
    "pivot_root",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "move_mount",
    "open_tree",
    "open_tree_attr",
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
)

DENY_RULES: Final[tuple[Rule, ...]] = (
    Rule("clone3", errno.ENOSYS),
    *(Rule(name) for name in _UNCONDITIONAL),
    Rule(
        "socket",
        when=(
            (Arg(0, "eq", AF_PACKET),),
            (Arg(0, "eq", AF_BLUETOOTH),),
            (Arg(0, "eq", AF_VSOCK),),
            (Arg(0, "eq", AF_NETLINK), Arg(2, "ne", 0)),  # only NETLINK_ROUTE (getifaddrs)
        ),
    ),
    Rule("execveat", when=((Arg(4, "set", AT_EMPTY_PATH),),)),
    Rule("unshare", when=((Arg(0, "set", linux.CLONE_NEWUSER),),)),
    Rule("clone", when=((Arg(0, "set", linux.CLONE_NEWUSER),),)),
    Rule("seccomp", when=((Arg(0, "eq", SECCOMP_SET_MODE_FILTER),),)),
    Rule("prctl", when=((Arg(0, "eq", linux.PR_SET_SECCOMP), Arg(1, "eq", linux.SECCOMP_MODE_FILTER)),)),
)

# The connect-notify filter (docs/design.md "Identity"): installed in each workload child after fork and before
# execve (a spare exec-init's commands: in the exec-init, once, before any command exists, ``child.SELF``; it makes
# no trapped call itself, its commands' ``posix_spawn`` children do), never in the launcher, the workload's init or
# the fence probe. ``connect`` and
# ``execve``/``execveat`` wait for the boundary's answer (supervisor/boundary/capture/connect_notify.py); a TCP Fast
# Open send (a connect without ``connect``) and a workload's own listener are refused; io_uring (which connects
# without a syscall) stays denied even where the deny list is off.
MSG_FASTOPEN: Final = 0x20000000
SECCOMP_FILTER_FLAG_NEW_LISTENER: Final = 1 << 3
NOTIFY_RULES: Final[tuple[Rule, ...]] = (
    Rule("connect", ret=RET_USER_NOTIF),
    Rule("execve", ret=RET_USER_NOTIF),
    Rule("execveat", ret=RET_USER_NOTIF),
    Rule("sendto", errno.EOPNOTSUPP, when=((Arg(3, "set", MSG_FASTOPEN),),)),
    Rule("sendmsg", errno.EOPNOTSUPP, when=((Arg(2, "set", MSG_FASTOPEN),),)),
    Rule("sendmmsg", errno.EOPNOTSUPP, when=((Arg(3, "set", MSG_FASTOPEN),),)),
    Rule(
        "seccomp",
        when=((Arg(0, "eq", SECCOMP_SET_MODE_FILTER), Arg(1, "set", SECCOMP_FILTER_FLAG_NEW_LISTENER)),),
    ),
    Rule("io_uring_setup"),
    Rule("io_uring_enter"),
    Rule("io_uring_register"),
)


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    if not (0 <= jt <= 255 and 0 <= jf <= 255):
        raise ValueError("BPF jump out of range")
    return struct.pack("=HBBI", code, jt, jf, k)


def _clause(tests: tuple[Arg, ...], ret: int) -> list[bytes]:
    """Instructions returning ``ret`` if every test holds, else falling through past the clause."""
    # Each test is 2 insns (load, jump); then one ret. A failing jump lands just after the ret.
    out: list[bytes] = []
    n = len(tests)
    for i, test in enumerate(tests):
        to_end = 2 * (n - i - 1) + 1  # instructions after this jump up to and including the ret
        out.append(_insn(BPF_LD_W_ABS, 0, 0, _arg_low(test.index)))
        k = test.value & 0xFFFFFFFF
        if test.op == "eq":
            out.append(_insn(BPF_JEQ_K, 0, to_end, k))
        elif test.op == "ne":
            out.append(_insn(BPF_JEQ_K, to_end, 0, k))
        else:
            out.append(_insn(BPF_JSET_K, 0, to_end, k))
    out.append(_insn(BPF_RET_K, 0, 0, ret))
    return out


def _rule_block(rule: Rule, nr: int) -> list[bytes]:
    ret = RET_ERRNO | (rule.errno & 0xFFFF) if rule.ret is None else rule.ret
    if not rule.when:
        body = [_insn(BPF_RET_K, 0, 0, ret)]
    else:
        body = [insn for clause in rule.when for insn in _clause(clause, ret)]
        body.append(_insn(BPF_LD_W_ABS, 0, 0, OFF_NR))  # no clause held: restore nr for the next rule
    return [_insn(BPF_JEQ_K, 0, len(body), nr), *body]


def build(arch: str = linux.MACHINE, rules: tuple[Rule, ...] = DENY_RULES) -> bytes:
    """The filter program for ``arch`` as packed ``struct sock_filter`` records."""
    if arch not in AUDIT_ARCH:
        raise OSError(errno.ENOSYS, f"seccomp filter has no syscall table for {arch}")
    table = SYSCALLS[arch]
    prog = [
        _insn(BPF_LD_W_ABS, 0, 0, OFF_ARCH),
        _insn(BPF_JEQ_K, 1, 0, AUDIT_ARCH[arch]),
        _insn(BPF_RET_K, 0, 0, RET_KILL_PROCESS),
        _insn(BPF_LD_W_ABS, 0, 0, OFF_NR),
    ]
    if arch == "x86_64":
        prog += [_insn(BPF_JGE_K, 0, 1, X32_SYSCALL_BIT), _insn(BPF_RET_K, 0, 0, RET_ERRNO | errno.EPERM)]
    for rule in rules:
        prog += _rule_block(rule, table[rule.syscall])
    prog.append(_insn(BPF_RET_K, 0, 0, RET_ALLOW))
    if len(prog) > 4096:
        raise ValueError("seccomp program too long")
    return b"".join(prog)


@functools.cache
def program(arch: str = linux.MACHINE) -> bytes:
    """``build(arch)`` once per process: the forking process warms it so each child only installs."""
    return build(arch)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


@functools.cache
def _fprog(program: bytes) -> tuple[ctypes.Array[ctypes.c_char], _SockFprog, ctypes.c_void_p]:
    """``program`` as the ``struct sock_fprog`` the kernel reads (with the buffer it points into, kept alive),
    made once per process: the forking process warms it (``warm``) so each child passes a pointer."""
    buf = ctypes.create_string_buffer(program, len(program))
    prog = _SockFprog(len(program) // 8, ctypes.cast(buf, ctypes.c_void_p))
    return buf, prog, ctypes.c_void_p(ctypes.addressof(prog))


def install(program: bytes) -> None:
    """Install ``program`` on the calling thread; ``no_new_privs`` must already be set."""
    linux.prctl_ptr(linux.PR_SET_SECCOMP, linux.SECCOMP_MODE_FILTER, _fprog(program)[2])


@functools.cache
def notify_program(arch: str = linux.MACHINE) -> bytes:
    """The connect-notify filter for ``arch``, built once per process like :func:`program`."""
    return build(arch, NOTIFY_RULES)


def install_listener(program: bytes, arch: str = linux.MACHINE) -> int:
    """Install ``program`` with ``SECCOMP_FILTER_FLAG_NEW_LISTENER``; returns the listener fd (close-on-exec).

    ``no_new_privs`` must already be set. Install it before :func:`install` (the deny list refuses ``seccomp``)."""
    if arch not in SYSCALLS:
        raise OSError(errno.ENOSYS, f"seccomp filter has no syscall table for {arch}")
    return linux.syscall(
        SYSCALLS[arch]["seccomp"], SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER, _fprog(program)[2]
    )


def warm(arch: str = linux.MACHINE) -> None:
    """Build both programs and their ``sock_fprog`` in a forking process, once, for every child it forks."""
    _fprog(program(arch))
    _fprog(notify_program(arch))

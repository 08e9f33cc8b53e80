"""Exact TCP socket lookup with ``NETLINK_SOCK_DIAG`` (``inet_diag``), by full 4-tuple.

Reading ``/proc/<pid>/net/tcp`` walks the kernel's whole established hash (milliseconds per read on a large
table); an exact ``SOCK_DIAG_BY_FAMILY`` request is one hash lookup (~20 µs). A netlink socket answers for the
network namespace it was created in, so the launcher opens it inside the agent's namespace and passes it out.
The sockid describes the socket from its own side: src = the agent's end, dst = the listener's end. An IPv4
query also finds a dual-stack socket connected to an IPv4-mapped address (same established hash).
"""

from __future__ import annotations

import errno
import ipaddress
import itertools
import socket
import struct
import threading
from dataclasses import dataclass

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST = 0x1
NLMSG_ERROR = 0x2
INET_DIAG_NOCOOKIE = 0xFFFFFFFF

_NLMSGHDR = struct.Struct("=IHHII")
_REQ_HEAD = struct.Struct("=BBBBI")  # family, protocol, ext, pad, states
_SOCKID_TAIL = struct.Struct("=III")  # interface, cookie[2]
_MSG_HEAD = struct.Struct("=BBBB")  # family, state, timer, retrans
_MSG_TAIL = struct.Struct("=IIIII")  # expires, rqueue, wqueue, uid, inode
_SOCKID_LEN = 48


@dataclass(frozen=True)
class DiagResult:
    state: int
    uid: int
    inode: int
    cookie: int = 0  # the socket's cookie (SO_COOKIE), what a connect-time record is keyed by


class SockDiag:
    """A sock_diag netlink socket of one namespace; ``lookup`` is thread-safe."""

    def __init__(self, sock: socket.socket, *, timeout: float = 1.0) -> None:
        self._sock = sock
        self._sock.settimeout(timeout)
        self._lock = threading.Lock()
        self._seq = itertools.count(1)

    @classmethod
    def open(cls) -> SockDiag:
        return cls(socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG))

    def close(self) -> None:
        self._sock.close()

    def lookup(self, src: tuple[str, int], dst: tuple[str, int]) -> DiagResult | None:
        """The TCP socket whose own end is ``src`` and peer is ``dst``; ``None`` if there is none.

        Raises ``OSError`` for anything but "no such socket" (e.g. no inet_diag in this kernel)."""
        src_ip, dst_ip = ipaddress.ip_address(src[0]), ipaddress.ip_address(dst[0])
        family = socket.AF_INET if src_ip.version == dst_ip.version == 4 else socket.AF_INET6
        sockid = (
            struct.pack("!HH", src[1], dst[1])
            + _packed(src_ip, family)
            + _packed(dst_ip, family)
            + _SOCKID_TAIL.pack(0, INET_DIAG_NOCOOKIE, INET_DIAG_NOCOOKIE)
        )
        request = _REQ_HEAD.pack(family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF) + sockid
        with self._lock:
            seq = next(self._seq) & 0xFFFFFFFF
            self._sock.send(_NLMSGHDR.pack(_NLMSGHDR.size + len(request), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST, seq, 0)
                            + request)  # fmt: skip
            while True:
                data = self._sock.recv(65536)
                _length, kind, _flags, got_seq, _pid = _NLMSGHDR.unpack_from(data)
                if got_seq == seq:
                    break  # answers to an earlier, timed-out request are skipped
        body = data[_NLMSGHDR.size :]
        if kind == NLMSG_ERROR:
            (code,) = struct.unpack_from("=i", body)
            if -code == errno.ENOENT:
                return None
            raise OSError(-code, f"sock_diag: {errno.errorcode.get(-code, str(-code))}")
        _family, state, _timer, _retrans = _MSG_HEAD.unpack_from(body)
        *_, uid, inode = _MSG_TAIL.unpack_from(body, _MSG_HEAD.size + _SOCKID_LEN)
        # idiag_cookie[2] ends the sockid: low word first (sock_diag_save_cookie)
        low, high = struct.unpack_from("=II", body, _MSG_HEAD.size + _SOCKID_LEN - 8)
        return DiagResult(state=state, uid=uid, inode=inode, cookie=low | high << 32)


def _packed(ip: ipaddress.IPv4Address | ipaddress.IPv6Address, family: int) -> bytes:
    if family == socket.AF_INET6 and isinstance(ip, ipaddress.IPv4Address):
        ip = ipaddress.IPv6Address(b"\0" * 10 + b"\xff\xff" + ip.packed)
    return ip.packed.ljust(16, b"\0")

"""Whole-file reads of procfs entries (``/proc/PID/stat``, ``status``, ``environ``, ...).

``open()`` wraps each file in buffered IO objects and asks the kernel for its size, position and terminal-ness
(an ``fstat``, two ``lseek`` and an ``ioctl`` per open) before the read; the identity checks read several such
files while a workload process waits in ``execve`` or ``connect``, so they read with ``os.read`` instead.
"""

from __future__ import annotations

import os

_CHUNK = 65536


def read(path: str) -> bytes:
    """The whole of ``path``, read to EOF (procfs may hand a large file over in pieces); raises ``OSError``
    as ``open`` would (``FileNotFoundError`` for a process that is gone)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        data = os.read(fd, _CHUNK)
        if not data:
            return data
        chunks = [data]
        while chunk := os.read(fd, _CHUNK):
            chunks.append(chunk)
        return b"".join(chunks) if len(chunks) > 1 else data
    finally:
        os.close(fd)

"""The SNI reader of the inspected path (``supervisor.control.l7.client_hello.server_name``).

Oracles beyond "no crash":

* it answers ``Pending``, a name or ``None``, or raises ``ClientHelloError``, nothing else;
* a name is non-empty printable ASCII;
* it never decides early: where the whole input gives a name (or no SNI), every prefix gives ``Pending`` or
  that same answer — never an error, never another name.
"""

from __future__ import annotations

from supervisor.control.l7.client_hello import ClientHelloError, Pending, server_name


def _answer(data: bytes) -> str | Pending | ClientHelloError | None:
    try:
        return server_name(data)
    except ClientHelloError as exc:
        return exc


def one_input(data: bytes) -> None:
    whole = _answer(data)
    if isinstance(whole, ClientHelloError | Pending):
        return
    if whole is not None:
        assert whole and whole.isascii() and whole.isprintable(), whole
    for cut in {1, 5, 9, len(data) // 2, len(data) - 1}:
        if 0 < cut < len(data):
            part = _answer(data[:cut])
            assert isinstance(part, Pending) or part == whole, (cut, part, whole)

"""The intercepted-HTTPS client: HTTPS to the bench's origin through a proxy's CONNECT tunnel.

The same client for every contender, as :mod:`bench.clients` is for the raw path: a CONNECT (or none, for
direct), then TLS verified against the one CA this contender's client trusts, then HTTP/1.1.

* ``cafile`` names that CA: the origin's own for direct (TLS end to end), the bench's bump CA for mitmproxy and
  squid with SSL bump, and ``None`` for the sandbox, whose agent trusts its interception CA through
  ``SSL_CERT_FILE`` in the environment the boundary gives it (``ssl.create_default_context`` reads it).
* A setup sample is connect + CONNECT + TLS handshake + one small GET with ``Connection: close`` and its whole
  response, timed by the client; the origin closes first (its FIN is awaited untimed, as in ``bench.clients``).
* A download is one GET of ``/big/N`` on a fresh connection: the clock runs from the request to the last byte
  (the handshake is the setup row's business).

Only the standard library and the other copied modules are imported: this file is part of the driver's copy.
"""

from __future__ import annotations

import ssl
import time
from collections import Counter
from collections.abc import Mapping

from bench.clients import BulkResult, SetupResult, _await_eof, error_kind, open_tunnel
from bench.wire import WireError

Address = tuple[str, int]
CHUNK = 1024 * 1024
HEADER_LIMIT = 64 * 1024
SMALL_PATH = "/small"


def tls_context(cafile: str | None) -> ssl.SSLContext:
    """Verification against ``cafile`` alone, or against the environment's trust (``SSL_CERT_FILE``) when None.

    The chain is always verified; the name is checked by :func:`check_address` (not by OpenSSL), because squid 5
    mints its bumped leaf for an address literal with the address in a *DNS* subjectAltName, which OpenSSL's IP
    check rejects. Every contender's leaf goes through the same check.
    """
    context = ssl.create_default_context(cafile=cafile) if cafile else ssl.create_default_context()
    context.check_hostname = False  # verify_mode stays CERT_REQUIRED
    return context


def check_address(cert: Mapping[str, object], address: str) -> None:
    """The verified leaf must name ``address`` in its subjectAltName (as an IP address, or squid's DNS form)."""
    names = cert.get("subjectAltName") or ()
    assert isinstance(names, tuple)
    if not any(kind in ("IP Address", "DNS") and value == address for kind, value in names):
        raise WireError(f"the certificate does not name {address} (subjectAltName {names!r})")


def request(target: Address, path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: {target[0]}:{target[1]}\r\nConnection: close\r\n\r\n".encode()


def parse_head(buffer: bytes) -> tuple[int, int, bytes] | None:
    """(status, Content-Length, bytes after the head) once ``buffer`` holds a whole response head, else None."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        if len(buffer) > HEADER_LIMIT:
            raise WireError(f"response head longer than {HEADER_LIMIT} bytes")
        return None
    lines = buffer[:end].decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise WireError(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
    length = None
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    if length is None:
        raise WireError("response without Content-Length")
    return int(parts[1]), length, buffer[end + 4 :]


def _open(proxy: Address | None, target: Address, context: ssl.SSLContext, timeout: float) -> ssl.SSLSocket:
    raw = open_tunnel(proxy, target, timeout)
    try:
        tls = context.wrap_socket(raw, server_hostname=target[0])
    except BaseException:
        raw.close()
        raise
    try:
        check_address(tls.getpeercert() or {}, target[0])
    except BaseException:
        tls.close()
        raise
    return tls


def _get(sock: ssl.SSLSocket, target: Address, path: str, buffer: memoryview) -> int:
    """Send one GET and read its whole response; return the body's length (a non-200 is an error)."""
    sock.sendall(request(target, path))
    head = b""
    while (parsed := parse_head(head)) is None:
        chunk = sock.recv(4096)
        if not chunk:
            raise WireError("connection closed before the response head")
        head += chunk
    status, length, body = parsed
    if status != 200:
        raise WireError(f"origin or proxy answered {status}")
    remaining = length - len(body)
    while remaining > 0:
        n = sock.recv_into(buffer, min(remaining, len(buffer)))
        if not n:
            raise WireError(f"response body ended {remaining} bytes short")
        remaining -= n
    return length


def https_exchange(proxy: Address | None, target: Address, context: ssl.SSLContext, timeout: float) -> float:
    """Seconds for connect + CONNECT + TLS handshake + one small GET and its response."""
    buffer = memoryview(bytearray(64 * 1024))
    start = time.perf_counter()
    with _open(proxy, target, context, timeout) as sock:
        _get(sock, target, SMALL_PATH, buffer)
        seconds = time.perf_counter() - start
        _await_eof(sock)
    return seconds


def https_setup_sequential(
    proxy: Address | None, target: Address, cafile: str | None, count: int, timeout: float, budget: float
) -> SetupResult:
    """Up to ``count`` HTTPS exchanges one after another, stopping early once ``budget`` seconds have passed."""
    context = tls_context(cafile)
    latencies: list[float] = []
    kinds: Counter[str] = Counter()
    start = time.perf_counter()
    for _ in range(count):
        if time.perf_counter() - start > budget:
            break
        try:
            latencies.append(https_exchange(proxy, target, context, timeout))
        except (OSError, WireError, ValueError) as exc:  # ssl.SSLError is an OSError
            kinds[error_kind(exc)] += 1
    return SetupResult(latencies, kinds.total(), time.perf_counter() - start, dict(kinds))


def https_download(proxy: Address | None, target: Address, cafile: str | None, size: int, timeout: float) -> BulkResult:
    """GET ``size`` bytes from the origin over one HTTPS connection; timed from the request to the last byte."""
    with _open(proxy, target, tls_context(cafile), timeout) as sock:
        start = time.perf_counter()
        got = _get(sock, target, f"/big/{size}", memoryview(bytearray(CHUNK)))
        seconds = time.perf_counter() - start
        if got != size:
            raise WireError(f"origin sent {got} bytes, not {size}")
        _await_eof(sock)
    return BulkResult(size, seconds)

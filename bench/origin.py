"""The HTTPS origin of the intercepted scenarios, and the run's TLS material.

``python3 -m bench.origin --host ADDR --cert C --key K`` serves HTTPS/1.1 on ADDR (the harness's upstream host,
inside its namespace, like ``bench.upstream``), prints ``READY <port>`` once bound and exits when its stdin
closes or on SIGTERM. Two resources: ``GET /small`` (1 KiB) and ``GET /big/N`` (N bytes). Every response
closes its connection when the request asked so (the client always does): the origin closes first, so TIME_WAIT
stays in its own namespace (see ``bench.upstream``).

:func:`make_material` writes the run's certificates (trustme, fresh per run, in the run's temporary directory):

* the **origin CA** and the origin's leaf for its IP address — what direct trusts, and what every intercepting
  contender verifies the origin against (mitmproxy ``ssl_verify_upstream_trusted_ca``, squid
  ``tls_outgoing_options cafile=``, the sandbox's ``dev --upstream-ca``);
* the **bump CA** (certificate, key, and the two in one file as mitmproxy's ``confdir`` wants it) that mitmproxy
  and squid's ``generate-host-certificates`` sign their leaves with, and that the client trusts for them. The
  sandbox signs with its own interception CA, which its agent trusts through its environment.
"""

from __future__ import annotations

import argparse
import http.server
import os
import signal
import ssl
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SMALL = b"s" * 1024
CHUNK = b"x" * (1024 * 1024)


class OriginHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        if self.path.startswith("/big/"):
            try:
                size = int(self.path.split("/")[2])
            except ValueError:
                self.send_error(400)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(size))
            self.end_headers()
            view = memoryview(CHUNK)
            while size:
                n = min(size, len(view))
                self.wfile.write(view[:n])
                size -= n
            return
        if self.path != "/small":
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(SMALL)))
        self.end_headers()
        self.wfile.write(SMALL)


class TlsServer(http.server.ThreadingHTTPServer):
    """The handshake runs in the request's thread, never in the accept loop (one slow client blocks nobody)."""

    daemon_threads = True
    request_queue_size = 1024
    context: ssl.SSLContext

    def finish_request(self, request: Any, client_address: Any) -> None:
        try:
            tls = self.context.wrap_socket(request, server_side=True)
        except (OSError, ValueError):
            return
        try:
            self.RequestHandlerClass(tls, client_address, self)
        finally:
            tls.close()  # the request's socket was detached into ``tls``: this is the one close


def serve(host: str, cert: Path, key: Path) -> None:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    context.num_tickets = 0  # every setup sample is a full handshake, for every contender alike
    server = TlsServer((host, 0), OriginHandler)
    server.context = context
    print(f"READY {server.server_address[1]}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())

    def end_with_stdin() -> None:
        sys.stdin.read()
        server.shutdown()

    threading.Thread(target=end_with_stdin, daemon=True).start()
    server.serve_forever()
    server.server_close()


@dataclass(frozen=True)
class TlsMaterial:
    origin_ca: Path  # PEM certificate
    origin_cert: Path  # the origin's chain
    origin_key: Path
    bump_ca: Path  # PEM certificate the client trusts for mitmproxy and squid-bump
    bump_key: Path
    bump_combined: Path  # key + certificate in one file (mitmproxy's confdir/mitmproxy-ca.pem)


def make_material(directory: Path, address: str) -> TlsMaterial:
    """Fresh CAs and the origin's leaf for ``address``, written (0644, test keys) under ``directory``."""
    import trustme  # the harness's environment has it; the origin process itself needs only the files

    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o755)
    origin_ca = trustme.CA(organization_name="openshell bench origin CA")
    # the address as the subject's CN too: squid 5 matches an address literal against the CN, not an IP SAN
    leaf = origin_ca.issue_cert(address, common_name=address)
    bump = trustme.CA(organization_name="openshell bench bump CA")
    material = TlsMaterial(*(directory / n for n in ("origin-ca.pem", "origin.pem", "origin.key", "bump-ca.pem",
                                                      "bump-ca.key", "bump-ca-combined.pem")))  # fmt: skip
    origin_ca.cert_pem.write_to_path(str(material.origin_ca))
    leaf.private_key_pem.write_to_path(str(material.origin_key))
    material.origin_cert.write_bytes(b"".join(p.bytes() for p in leaf.cert_chain_pems))
    bump.cert_pem.write_to_path(str(material.bump_ca))
    bump.private_key_pem.write_to_path(str(material.bump_key))
    material.bump_combined.write_bytes(bump.private_key_pem.bytes() + bump.cert_pem.bytes())
    for path in (material.origin_ca, material.origin_cert, material.origin_key, material.bump_ca,
                 material.bump_key, material.bump_combined):  # fmt: skip
        path.chmod(0o644)  # squid reads as its effective user, the sandbox's control as its own
    return material


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python3 -m bench.origin")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default %(default)s)")
    parser.add_argument("--cert", type=Path, required=True, help="PEM certificate chain")
    parser.add_argument("--key", type=Path, required=True, help="PEM private key")
    args = parser.parse_args(argv)
    serve(args.host, args.cert, args.key)


if __name__ == "__main__":
    main()

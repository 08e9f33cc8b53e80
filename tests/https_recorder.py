"""An HTTPS origin for test hosts that records what reached it:
``python3 tests/https_recorder.py ADDRESS PORT CERT_PEM KEY_PEM LOG_FILE`` (``- -`` for plain HTTP).

Every request is appended to LOG_FILE as one JSON line (method, path, Host, Authorization, X-Api-Key, body
size, Range, Accept-Encoding), so a test can assert what a credential became upstream — and that nothing
reached it at all. GET and POST answer 200 with a small JSON body; git's dumb-HTTP paths (and a pip simple
index, ``/simple/`` and ``/packages/``) are served from the directory in ``$RECORDER_ROOT`` when set;
``/echo/...`` hands back the last ``X-Api-Key`` it received where a response scrubber could miss it
(``_echo``). No name lookups (``http.server`` would do a reverse DNS lookup on bind).
"""

from __future__ import annotations

import gzip
import http.server
import json
import os
import socketserver
import ssl
import sys
import threading
import time

_lock = threading.Lock()
_stored = {"key": b""}  # the last X-Api-Key received: an origin that keeps what request one carried


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def server_bind(self) -> None:
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)


class _Recorder(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    log_file = ""

    def _record(self, body: bytes) -> None:
        entry = {
            "method": self.command,
            "path": self.path,
            "host": self.headers.get("Host"),
            "authorization": self.headers.get("Authorization"),
            "x_api_key": self.headers.get("X-Api-Key"),
            "body": len(body),
            "range": self.headers.get("Range"),
            "accept_encoding": self.headers.get("Accept-Encoding"),
        }
        with _lock, open(self.log_file, "a") as out:
            out.write(json.dumps(entry) + "\n")

    def _answer(self) -> None:
        payload = json.dumps({"ok": True, "method": self.command, "path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _echo(self) -> None:
        """``/echo/reason``: the key in the reason phrase; ``/echo/name``: in a header name; ``/echo/hints``: in a
        ``103 Early Hints`` head; ``/echo/doc``: ``token=<key>;``, in ``Range`` slices (``206``) when asked, gzipped
        when accepted."""
        with _lock:
            if self.headers.get("X-Api-Key"):
                _stored["key"] = self.headers["X-Api-Key"].encode()
            key = _stored["key"]
        what = self.path[len("/echo/") :]
        body = b"ok\n"
        if what == "hints":
            self.wfile.write(b"HTTP/1.1 103 Early Hints " + key + b"\r\nLink: </" + key + b">\r\n\r\n")
        if what == "doc":
            body = b"token=" + key + b";"
            wanted = self.headers.get("Range", "")
            if wanted.startswith("bytes="):
                first, last = (int(n) for n in wanted[6:].split("-"))
                piece = body[first : last + 1]
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {first}-{last}/{len(body)}")
                self.send_header("Content-Length", str(len(piece)))
                self.end_headers()
                self.wfile.write(piece)
                return
            if "gzip" in self.headers.get("Accept-Encoding", ""):
                body = gzip.compress(body)
                self.send_response(200)
                self.send_header("Content-Encoding", "gzip")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
        self.send_response(200, "OK " + key.decode() if what == "reason" else None)
        if what == "name":
            self.send_header("X-" + key.decode(), "1")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._record(b"")
        if self.path.startswith("/echo/"):
            self._echo()
            return
        if self.path.startswith("/slow/"):  # /slow/N: N KiB, one every 0.2 s (a streamed response)
            count = int(self.path.split("/")[2])
            self.send_response(200)
            self.send_header("Content-Length", str(count * 1024))
            self.end_headers()
            for _ in range(count):
                self.wfile.write(b"s" * 1024)
                self.wfile.flush()
                time.sleep(0.2)
            return
        if os.environ.get("RECORDER_ROOT") and self.path.startswith(("/repo.git", "/simple/", "/packages/")):
            super().do_GET()
            return
        self._answer()

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._record(body)
        self._answer()

    def __getattr__(self, name: str) -> object:
        """Any other method (PROPFIND, BREW, ...) is recorded and answered like POST: so a test can tell
        whether a request with a method no list names reached the origin."""
        if name.startswith("do_") and name[3:].isupper():
            return self.do_POST
        raise AttributeError(name)

    def log_message(self, format: str, *args: object) -> None:
        pass


def main() -> None:
    address, port, cert, key, log_file = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
    _Recorder.log_file = log_file
    root = os.environ.get("RECORDER_ROOT") or "/"

    def handler(*args: object) -> _Recorder:
        return _Recorder(*args, directory=root)  # type: ignore[arg-type]

    with _Server((address, port), handler) as server:
        if cert != "-":  # "-" "-": plain HTTP
            ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ctx.load_cert_chain(cert, key)
            server.socket = ctx.wrap_socket(server.socket, server_side=True)
        server.serve_forever()


if __name__ == "__main__":
    main()

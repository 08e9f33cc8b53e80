"""A static file server for test hosts: ``python3 tests/http_fileserver.py ADDRESS PORT DIRECTORY``.

``python -m http.server`` calls ``socket.getfqdn`` when it binds, a reverse DNS lookup that hangs inside a test
host's namespace (no resolver there, by design); this one never looks anything up.
"""

from __future__ import annotations

import functools
import http.server
import socketserver
import sys


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def server_bind(self) -> None:
        socketserver.TCPServer.server_bind(self)  # skips HTTPServer's getfqdn()
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass


def main() -> None:
    address, port, directory = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    handler = functools.partial(_Quiet, directory=directory)
    with _Server((address, port), handler) as server:
        server.serve_forever()


if __name__ == "__main__":
    main()

"""A model API for test hosts: ``python3 tests/inference_backend.py ADDRESS PORT CERT KEY LOG KEY_VALUE``.

It answers the OpenAI-compatible shapes (chat completions, streamed as SSE when asked, embeddings) and Anthropic's
``/v1/messages`` only when the request carries KEY_VALUE the way its kind expects (``Authorization: Bearer`` or
``x-api-key``), and appends one JSON line per request to LOG: method, path, model, whether the key was right, and
every header value (so a test can assert that the agent's dummy key never arrived). Model ``stall`` streams two
chunks and then sends nothing (a backend stalling mid-stream); model ``echo-key`` puts the key it received in its
answer (what the scrubber must catch); model ``count`` streams ``max_tokens`` one-token events (bench/bench_l7.py's
tokens/s row). No name lookups.
"""

from __future__ import annotations

import http.server
import json
import socketserver
import ssl
import sys
import threading
import time

_lock = threading.Lock()


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def server_bind(self) -> None:
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)


class _Backend(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    log_file = ""
    key = ""

    def log_message(self, *args: object) -> None:
        pass

    def _json(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _sse(self, events: list[bytes], *, stall: bool = False) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        for event in events:
            self.wfile.write(event)
            self.wfile.flush()
        if stall:
            time.sleep(3600)
        self.close_connection = True

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        try:
            request = json.loads(body)
        except ValueError:
            request = {}
        anthropic = self.path == "/v1/messages"
        given = self.headers.get("x-api-key") if anthropic else self.headers.get("Authorization", "")
        ok = given == (self.key if anthropic else f"Bearer {self.key}")
        model = request.get("model")
        with _lock, open(self.log_file, "a") as out:
            out.write(json.dumps({"method": "POST", "path": self.path, "model": model, "key_ok": ok,
                                  "stream": request.get("stream", False),
                                  "headers": {k.lower(): v for k, v in self.headers.items()}}) + "\n")  # fmt: skip
        if not ok:
            self._json(401, {"error": {"type": "authentication_error", "message": "wrong key"}})
            return
        text = f"key={given}" if model == "echo-key" else "hello from the test model"
        if self.path == "/v1/embeddings":
            self._json(
                200,
                {
                    "object": "list",
                    "model": model,
                    "usage": {"prompt_tokens": 1, "total_tokens": 1},
                    "data": [{"object": "embedding", "index": 0, "embedding": [0.25, 0.5, 0.75]}],
                },
            )
        elif anthropic and request.get("stream"):
            events = [("message_start", {"type": "message_start", "message": {
                "id": "msg_1", "type": "message", "role": "assistant", "model": model, "content": [],
                "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 0}}}),
                ("content_block_start", {"type": "content_block_start", "index": 0,
                                         "content_block": {"type": "text", "text": ""}})]  # fmt: skip
            events += [("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                "delta": {"type": "text_delta", "text": w + " "}})
                       for w in text.split()]  # fmt: skip
            events += [("content_block_stop", {"type": "content_block_stop", "index": 0}),
                       ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "end_turn",
                        "stop_sequence": None}, "usage": {"output_tokens": 5}}),
                       ("message_stop", {"type": "message_stop"})]  # fmt: skip
            self._sse([f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events])
        elif anthropic:
            self._json(200, {"id": "msg_1", "type": "message", "role": "assistant", "model": model,
                             "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
                             "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 5}})  # fmt: skip
        elif request.get("stream"):
            words = text.split() if model != "stall" else ["partial", "answer"]
            if model == "count":
                words = ["tok"] * int(request.get("max_tokens") or 16)
            chunks = [json.dumps({"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": model,
                                  "choices": [{"index": 0, "delta": {"content": w + " "}, "finish_reason": None}]})
                      for w in words]  # fmt: skip
            events = [f"data: {c}\n\n".encode() for c in chunks]
            if model != "stall":
                events.append(b"data: [DONE]\n\n")
            self._sse(events, stall=model == "stall")
        else:
            self._json(200, {"id": "c1", "object": "chat.completion", "created": 0, "model": model,
                             "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                          "finish_reason": "stop"}],
                             "usage": {"prompt_tokens": 1, "completion_tokens": 5, "total_tokens": 6}})  # fmt: skip


def main() -> None:
    address, port, cert, key, log, secret = sys.argv[1:7]
    _Backend.log_file, _Backend.key = log, secret
    server = _Server((address, int(port)), _Backend)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    server.serve_forever()


if __name__ == "__main__":
    main()

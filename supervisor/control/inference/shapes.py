"""What ``inference.local`` accepts and what it sends on (docs/reference/policy.md §3.16). Pure.

Rules:

1. A request is one of the known shapes or it is denied: ``POST /v1/chat/completions``, ``/v1/completions``,
   ``/v1/responses``, ``/v1/embeddings`` (OpenAI-compatible backends), ``POST /v1/messages`` (Anthropic), ``GET
   /v1/models`` and ``GET /v1/models/{id}``. The path is compared as sent, byte for byte (no percent-encoding, dot
   segments or doubled slashes to read two ways); a ``POST`` carries no query. ``POST /model/{id}/invoke``
   (Bedrock-style) is not served.
2. ``models`` is answered by control from the routes the caller may use, in a shape both SDKs read (OpenAI's
   ``{object: list, data: [{id, object: model, owned_by}]}`` and Anthropic's ``{data: [{type: model, id,
   display_name, created_at}], has_more, first_id, last_id}`` in one body): the backend is never asked, so
   what the agent lists is exactly what it may call.
3. A body is JSON as every server reads it alike (``l7.body.strict_json``: no duplicate keys, no BOM, no NaN)
   and an object whose ``model`` is a string; it is forwarded as read, or re-encoded when the route rewrites
   the model.
4. Of the caller's headers only :data:`FORWARDED_HEADERS` go on; its ``Authorization`` and ``x-api-key`` never
   do. The backend gets its key the way its kind expects (``Authorization: Bearer`` or ``x-api-key``), its own
   ``Host``, the body's ``Content-Length`` and ``Accept-Encoding: identity`` (a body the scrubber can read).
5. Refusals use one JSON body both SDKs turn into a typed error (``{type: error, error: {type, message,
   code}}``).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable
from dataclasses import dataclass

from supervisor.control.inference.routes import BackendKind, Route
from supervisor.control.l7.body import BodyRefused, strict_json
from supervisor.protocol.json_value import JsonValue, is_json_object

__all__ = [
    "FORWARDED_HEADERS",
    "BodyInvalid",
    "InferenceBody",
    "ModelRequest",
    "Shape",
    "backend_headers",
    "error_body",
    "match_shape",
    "model_body",
    "models_body",
    "read_body",
]

ANTHROPIC_VERSION = b"2023-06-01"
# what the SDKs send that a backend needs to read the request; nothing that names the caller or carries a key
FORWARDED_HEADERS = frozenset({"content-type", "accept", "anthropic-version", "anthropic-beta", "openai-beta"})


class Shape(enum.StrEnum):
    CHAT = "chat-completions"
    COMPLETIONS = "completions"
    RESPONSES = "responses"
    EMBEDDINGS = "embeddings"
    MESSAGES = "messages"
    MODELS = "models"
    MODEL = "model"

    @property
    def kind(self) -> BackendKind | None:
        """The backend kind this shape is served by (``None``: answered by control)."""
        if self in (Shape.MODELS, Shape.MODEL):
            return None
        return BackendKind.ANTHROPIC if self is Shape.MESSAGES else BackendKind.OPENAI


_POSTS = {
    "/v1/chat/completions": Shape.CHAT,
    "/v1/completions": Shape.COMPLETIONS,
    "/v1/responses": Shape.RESPONSES,
    "/v1/embeddings": Shape.EMBEDDINGS,
    "/v1/messages": Shape.MESSAGES,
}


@dataclass(frozen=True)
class ShapeMatch:
    shape: Shape
    path: str
    model_id: str | None = None  # GET /v1/models/{id}


def match_shape(method: str, target: str) -> ShapeMatch | None:
    """Rule 1; ``None`` for anything else."""
    path, has_query, _query = target.partition("?")
    if any(ord(c) <= 0x20 or ord(c) >= 0x7F for c in target) or "%" in path or "//" in path or "/." in path:
        return None
    if method == "POST" and path in _POSTS and not has_query:
        return ShapeMatch(_POSTS[path], path)
    if method == "GET" and path == "/v1/models":
        return ShapeMatch(Shape.MODELS, path)
    if method == "GET" and path.startswith("/v1/models/") and len(path) > len("/v1/models/"):
        return ShapeMatch(Shape.MODEL, path, path[len("/v1/models/") :])
    return None


class BodyInvalid(ValueError):
    pass


@dataclass(frozen=True)
class InferenceBody:
    model: str
    stream: bool
    data: bytes  # what goes to the backend


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """A request body as rule 3 reads it: the model it names, whether it asks for a stream, and the whole object
    (which a model rewrite writes out again)."""

    model: str
    stream: bool
    document: dict[str, JsonValue]


def read_body(data: bytes) -> ModelRequest:
    """Rule 3's reading: the JSON object, or :class:`BodyInvalid` saying why."""
    try:
        value = strict_json(data)
    except BodyRefused as exc:
        raise BodyInvalid(str(exc)) from None
    if not is_json_object(value):
        raise BodyInvalid("the body is not a JSON object")
    model = value.get("model")
    if not isinstance(model, str) or not model:
        raise BodyInvalid("the body names no model (a string)")
    return ModelRequest(model, value.get("stream") is True, value)


def model_body(request: ModelRequest, data: bytes, route: Route) -> InferenceBody:
    """What goes to ``route``'s backend for the body ``data`` (read as ``request``): as read, or with the model
    rewritten (rule 3)."""
    model, stream = request.model, request.stream
    backend = route.backend_model(model)
    if backend == model:
        return InferenceBody(model, stream, data)
    rewritten = dict(request.document, model=backend)
    return InferenceBody(model, stream, json.dumps(rewritten, ensure_ascii=False, separators=(",", ":")).encode())


def backend_headers(
    route: Route, secret: str, caller: Iterable[tuple[str, str]], length: int
) -> list[tuple[bytes, bytes]]:
    """Rule 4: the headers of the backend request."""
    host = f"[{route.host}]" if ":" in route.host else route.host
    out = [(b"Host", f"{host}{'' if route.port == 443 else f':{route.port}'}".encode("ascii"))]
    seen: set[str] = set()
    for name, value in caller:
        lower = name.lower()
        if lower in FORWARDED_HEADERS and lower not in seen:
            seen.add(lower)
            out.append((lower.encode("ascii"), value.encode("utf-8")))
    if "content-type" not in seen:
        out.append((b"content-type", b"application/json"))
    if route.kind is BackendKind.ANTHROPIC:
        if "anthropic-version" not in seen:
            out.append((b"anthropic-version", ANTHROPIC_VERSION))
        out.append((b"x-api-key", secret.encode("ascii")))
    else:
        out.append((b"authorization", b"Bearer " + secret.encode("ascii")))
    out += [(b"content-length", str(length).encode("ascii")), (b"accept-encoding", b"identity")]
    return out


def _model_entry(route: Route, model: str) -> dict[str, JsonValue]:
    return {"id": model, "object": "model", "created": 0, "owned_by": route.name, "type": "model",
            "display_name": model, "created_at": "1970-01-01T00:00:00Z"}  # fmt: skip


def models_body(routes: list[Route]) -> bytes:
    """Rule 2, the list."""
    data = [_model_entry(r, m) for r in routes for m in r.models]
    body = {"object": "list", "data": data, "has_more": False,
            "first_id": data[0]["id"] if data else None, "last_id": data[-1]["id"] if data else None}  # fmt: skip
    return json.dumps(body, separators=(",", ":")).encode()


def model_entry_body(routes: list[Route], model_id: str) -> bytes | None:
    """Rule 2, one model (``None``: not one the caller may use)."""
    for route in routes:
        if model_id in route.models:
            return json.dumps(_model_entry(route, model_id), separators=(",", ":")).encode()
    return None


def error_body(kind: str, code: str, message: str) -> bytes:
    """Rule 5."""
    body = {"type": "error", "error": {"type": kind, "code": code, "message": message}}
    return json.dumps(body, separators=(",", ":")).encode()


def sse_error(message: str) -> bytes:
    """An SSE ``error`` event both SDKs raise as an API error: how a stream control cuts ends for the agent."""
    data = error_body("api_error", "inference_stream_cut", message).decode()
    return f"event: error\ndata: {data}\n\n".encode()

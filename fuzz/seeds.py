"""Write the seed corpus of every target from the project's test vectors: ``python -m fuzz.seeds``.

Seeds land in ``fuzz/corpus/<target>/`` named by their sha1 (libFuzzer's own naming), so running this again
adds nothing that is already there. The corpus then grows with each ``make fuzz`` run."""

from __future__ import annotations

import hashlib
import re
import ssl
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path

import dns.message
import dns.rdatatype

from fuzz.targets import TARGETS

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "fuzz" / "corpus"


def _client_hello(sni: str | None, alpn: list[str] | None = None) -> bytes:
    ctx = ssl.create_default_context() if sni else ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if sni is None:
        ctx.check_hostname = False
    if alpn:
        ctx.set_alpn_protocols(alpn)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_hostname=sni)
    try:
        obj.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return outgoing.read()


def proxy_head() -> Iterator[bytes]:
    from tests.unit import test_proxy_head as t

    yield from (head for head, _ in t.CONNECT_OK)
    yield from t.CONNECT_BAD
    yield from t.MALFORMED
    yield from (head for head, _ in t.FORWARD_OK)
    yield from (head for head, _, _ in t.FORWARD_REJECT)
    yield b"POST http://a.b/up HTTP/1.1\r\nHost: a.b\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\nGET"
    yield b"POST http://a.b/up HTTP/1.1\r\nHost: a.b\r\nContent-Length: 3\r\n\r\nabcdef"
    yield (
        b"GET http://a.b/ws HTTP/1.1\r\nHost: a.b\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
        b"Proxy-Authorization: Basic c2FuZGJveDp0b2tlbg==\r\n\r\n"
    )


def l7_request() -> Iterator[bytes]:
    from tests.unit import test_l7_head as t

    yield t.OK
    yield from (raw for raw, _ in t.REFUSED)
    chunked = b"POST /u HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\r\n"
    yield chunked + b"5;ext=1\r\nhello\r\n0\r\nX: y\r\n\r\n"
    yield b"POST /u HTTP/1.1\r\nHost: api.test\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\nhello"
    yield b"GET /ws HTTP/1.1\r\nHost: api.test\r\nConnection: keep-alive, Upgrade\r\nUpgrade: websocket\r\n\r\n"
    yield b"GET http://api.test:8080/x HTTP/1.0\r\nHost: api.test:8080\r\n\r\n"


def client_hello() -> Iterator[bytes]:
    for sni, alpn in (("api.test", None), ("example.com", ["h2", "http/1.1"]), (None, None)):
        hello = _client_hello(sni, alpn)
        yield hello
        body = hello[5:]  # the same hello over two records
        half = len(body) // 2
        yield (
            hello[:3]
            + struct.pack(">H", half)
            + body[:half]
            + hello[:3]
            + struct.pack(">H", len(body) - half)
            + (body[half:])
        )


def channel() -> Iterator[bytes]:
    from tests.unit import test_channel as t

    for direction in (0, 1, 2):
        for raw, _ in t.VALID:
            yield bytes([direction]) + raw
    for raw, _ in t.INVALID:
        if len(raw) < 4096:
            yield b"\x02" + raw
    yield b"\x01" + b"".join(raw for raw, _ in t.VALID)


def policy() -> Iterator[bytes]:
    from tests.unit.test_policy_properties import render

    yield (ROOT / "supervisor" / "control" / "default_policy.yaml").read_bytes()
    for doc in ("docs/policy.md", "README.md"):
        text = (ROOT / doc).read_text(encoding="utf-8")
        for block in re.findall(r"```yaml\n(.*?)```", text, re.S):
            yield block.encode()
    rules = {
        "gh": {
            "endpoints": [{"host": "api.github.com", "ports": [443], "l7": "read-only", "deny": "/admin/**"}],
            "binaries": ["/usr/bin/git", "/usr/bin/*"],
        },
        "any": {"endpoints": [{"host": "**.example.com", "ports": [80, 8080]}], "binaries": ["/opt/**/node"]},
    }
    yield render(rules, list(rules)).encode()
    yield (
        b'{"version": 1, "network_policies": {"a": {"endpoints": [{"host": "a.example.com", "port": 443, '
        b'"protocol": "rest", "enforcement": "enforce", "rules": [{"allow": {"method": "GET", "path": "/r/**", '
        b'"query": {"ref": {"any": ["a", "b*"]}}}}]}, {"host": "10.0.0.0", "port": 22, "protocol": "tcp", '
        b'"allowed_ips": ["10.0.0.0/24"]}], "binaries": [{"path": "/x", "allow_loader_env": true}]}}}'
    )


def dns_wire() -> Iterator[bytes]:
    for name, qtype in (("example.com.", "A"), ("api.test.", "AAAA"), ("_svc._tcp.test.", "SRV"), (".", "NS")):
        query = dns.message.make_query(name, dns.rdatatype.from_text(qtype))
        yield query.to_wire()
        yield dns.message.make_response(query).to_wire()
    yield dns.message.make_query("example.com.", "A", use_edns=0, payload=4096).to_wire()
    two = dns.message.make_query("example.com.", "A")
    two.question.append(two.question[0])
    yield two.to_wire()
    yield b"\x12\x34\x28\x00" + b"\x00" * 8  # an UPDATE header


def claims() -> Iterator[bytes]:
    from supervisor.protocol.certs import claims_extension_value
    from supervisor.protocol.claims import Role, claims_json
    from tests.certs_fixtures import SAMPLE_CLAIMS
    from tests.unit import test_claims as t

    for role in Role:
        yield claims_extension_value(SAMPLE_CLAIMS, role)
    yield claims_json(SAMPLE_CLAIMS)
    for _, data, _ in t._MALFORMED:
        if len(data) < 4096:
            yield data
            yield (
                b"\x0c" + bytes([len(data)]) + data
                if len(data) < 0x80
                else b"\x0c\x82" + struct.pack(">H", len(data)) + data
            )


def zygote() -> Iterator[bytes]:
    from supervisor.boundary.forkimage import child
    from supervisor.boundary.forkimage.landlock import LandlockSpec
    from supervisor.boundary.forkimage.messages import NamespacePlan
    from supervisor.boundary.forkimage.wire import encode
    from supervisor.protocol.privilege_model import PrivilegeModel

    spec = child.SpawnSpec(("/bin/sh", "-c", "echo hi"), {"PATH": "/usr/bin"}, "/work", 1000, 1000, (1000,))
    landlock = child.SpawnSpec(("/bin/true",), {}, "/", 0, 0, tty=True,
                               landlock=LandlockSpec(("/usr",), ("/work",), "hard_requirement"))  # fmt: skip
    plan = NamespacePlan(
        PrivilegeModel.U, hide_paths=("/run/secret",), capture={"mode": "netns"}, agent_ids=(1000, 1000)
    )
    yield encode({"op": "spawn", "id": 1, "sid": 7, "spec": spec.to_wire(), "stdio": [0, 1, 2, 3], "notify": 4})
    yield encode({"op": "spawn", "id": 2, "sid": 8, "spec": landlock.to_wire(), "stdio": [0, 0, 0, 1]})
    yield encode({"op": "prepare", "id": 3, "plan": plan.to_wire()})
    yield encode({"exit": 7, "status": 9})
    yield encode({"spare": 1234, "ns_pid": 1, "confinement": child.confinement(spec, True).to_wire(), "notes": ["x"]})
    yield encode({"unowned": 3, "pids": [10, 11, 12]})


def l7_body() -> Iterator[bytes]:
    import json

    rpc = {"jsonrpc": "2.0", "id": 1, "method": "eth_blockNumber"}
    yield b"\x00" + json.dumps(rpc).encode()
    yield b"\x00" + json.dumps([rpc, {**rpc, "id": 2, "method": "eth_sendTransaction"}]).encode()
    yield b"\x00" + b'{"jsonrpc":"2.0","id":1,"method":"eth_blockNumber","method":"x"}'
    call = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "read_file", "arguments": {}}}
    yield b"\x01" + json.dumps(call).encode()
    yield b"\x01" + json.dumps({"jsonrpc": "2.0", "id": 4, "method": "initialize", "params": {}}).encode()
    yield b"\x02" + json.dumps({"query": "query Viewer { viewer { login } }", "operationName": "Viewer"}).encode()
    yield b"\x02" + json.dumps([{"query": "{ viewer { id } }"}, {"query": "{ secrets }"}]).encode()
    yield b"\x02" + json.dumps({"query": "fragment F on Q { secrets } query { ...F }"}).encode()
    yield b"\x03" + b"query=%7B%20viewer%20%7B%20id%20%7D%20%7D"
    sub = {"type": "subscribe", "id": "1", "payload": {"query": "subscription { ticks }"}}
    yield b"\x04" + json.dumps(sub).encode()


SOURCES = {
    "proxy_head": proxy_head,
    "l7_request": l7_request,
    "client_hello": client_hello,
    "channel": channel,
    "policy": policy,
    "dns": dns_wire,
    "claims": claims,
    "zygote": zygote,
    "l7_body": l7_body,
}


def write(name: str, seeds: Iterable[bytes]) -> int:
    directory = CORPUS / name
    directory.mkdir(parents=True, exist_ok=True)
    added = 0
    for seed in seeds:
        path = directory / hashlib.sha1(seed).hexdigest()
        if not path.exists():
            path.write_bytes(seed)
            added += 1
    return added


def main() -> None:
    assert set(SOURCES) == set(TARGETS)
    for name, source in SOURCES.items():
        print(f"{name}: {write(name, source())} new seeds")


if __name__ == "__main__":
    main()

"""1,000 parallel transfers of random sizes through the full egress path.

The agent (an asyncio script under ``/usr/bin/python3``) opens 1,000 connections at once to an echo server on
the test host — half through the proxy listener (CONNECT), half transparently to the address the DNS stub
gave it — sends 1 KiB..512 KiB of random bytes on each (log-uniform: mostly small, some large), half-closes,
and checks with sha256 that exactly the same bytes came back. Control's events must show 1,000 allowed
connections whose byte counts match what was sent. Totals and wall time are printed (``pytest -s``).
Every transfer must arrive intact; any refusal fails the test.
"""

from __future__ import annotations

import json
from collections import Counter

from tests.e2e.attack_world import ECHO_PORT, AttackWorld, attack_world

__all__ = ["attack_world"]  # the module-scoped fixture

TRANSFERS = 1000
MIN_SIZE, MAX_SIZE = 1024, 512 * 1024

AGENT = """
import asyncio, math, random, resource

N, LOW, HIGH, PORT = {n}, {low}, {high}, CONFIG["echo"]
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # 1,000 sockets at once, plus the interpreter's own
rng = random.Random(4)
sizes = [int(math.exp(rng.uniform(math.log(LOW), math.log(HIGH)))) for _ in range(N)]
address = socket.getaddrinfo("api.test", PORT, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]


async def open_stream(i):
    if i % 2:
        return await asyncio.open_connection(address, PORT)
    reader, writer = await asyncio.open_connection(*PROXY)
    writer.write(f"CONNECT api.test:{{PORT}} HTTP/1.1\\r\\nHost: api.test:{{PORT}}\\r\\n\\r\\n".encode())
    head = await reader.readuntil(b"\\r\\n\\r\\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise ConnectionError(head.split(b"\\r\\n", 1)[0].decode())
    return reader, writer


async def transfer(i):
    # a first byte 0x16 is TLS to control whatever follows (design "Sniffing"): random bytes must not start like that
    payload = b"\\x00" + random.randbytes(sizes[i] - 1)
    try:
        reader, writer = await asyncio.wait_for(open_stream(i), 60)
    except Exception as exc:
        return i, 0, f"open: {{type(exc).__name__}}: {{exc}}"

    async def send():
        for at in range(0, len(payload), 65536):
            writer.write(payload[at:at + 65536])
            await writer.drain()
        writer.write_eof()  # often before the boundary has even identified us: that must not matter

    async def receive():
        digest, size = hashlib.sha256(), 0
        while data := await reader.read(65536):
            digest.update(data)
            size += len(data)
        return size, digest.hexdigest()

    try:
        _, (size, digest) = await asyncio.wait_for(asyncio.gather(send(), receive()), 120)
    except Exception as exc:
        return i, 0, f"transfer: {{type(exc).__name__}}: {{exc}}"
    finally:
        writer.close()
    if (size, digest) != (len(payload), hashlib.sha256(payload).hexdigest()):
        return i, size, f"mismatch: sent {{len(payload)}} bytes, got {{size}}"
    return i, size, None


async def main():
    started = time.monotonic()
    results = await asyncio.gather(*(transfer(i) for i in range(N)))
    wall = time.monotonic() - started
    failed = [(i, error) for i, _, error in results if error]
    report("load", ok=N - len(failed), failed=failed[:20], failures=len(failed), sizes=sizes,
           bytes_each_way=sum(size for _, size, _ in results), wall_s=round(wall, 3),
           nofile=[soft, hard])

asyncio.run(main())
"""


def test_a_thousand_parallel_transfers_arrive_intact(attack_world: AttackWorld) -> None:
    w = attack_world
    agent = w.run_agent(AGENT.format(n=TRANSFERS, low=MIN_SIZE, high=MAX_SIZE), timeout=240)
    assert "load" in agent.probes, agent.explain()
    load = agent.probes["load"]
    errors = [e for e in agent.events if e.get("event") in ("egress.error", "egress.refused")]
    print(
        f"\n{TRANSFERS} parallel transfers: {load['ok']} intact, {load['failures']} failed, "
        f"{load['bytes_each_way'] / 2**20:.1f} MiB each way in {load['wall_s']:.2f} s "
        f"({2 * load['bytes_each_way'] / 2**20 / load['wall_s']:.1f} MiB/s both ways through the path); "
        f"agent RLIMIT_NOFILE soft/hard {load['nofile']}; refusals: "
        f"{dict(Counter(str(e.get('reason') or e.get('error'))[:60] for e in errors))}"
    )
    assert load["failures"] == 0, f"{json.dumps(load['failed'], indent=1)}\n{errors[:10]}\n{agent.explain()}"
    assert load["ok"] == TRANSFERS
    assert load["bytes_each_way"] == sum(load["sizes"])
    assert agent.result.returncode == 0, agent.explain()
    allowed = [e for e in agent.egress() if e["decision"] == "allow" and e["destination"].endswith(f":{ECHO_PORT}")]
    assert len(allowed) == TRANSFERS, f"{len(allowed)} allow events"
    assert {e["capture"] for e in allowed} == {"connect", "transparent"}
    # control relayed exactly what was sent, both ways, on every connection: none lost, none duplicated
    assert sorted(e["bytes_out"] for e in allowed) == sorted(load["sizes"])
    assert sorted(e["bytes_in"] for e in allowed) == sorted(load["sizes"])
    assert all(e.get("error") is None for e in allowed), [e for e in allowed if e.get("error")][:5]
    assert errors == [], errors[:10]

"""Decision cost of the policy engine at 10, 1,000 and 10,000 rules.

Each policy mixes exact hosts, one-label host globs (``*.``), recursive globs (``**.``), REST endpoints, exact
binaries and binary globs. The request mix has hits on each kind, endpoint misses and binary misses. Prints
microseconds per decision and decisions per second for L4 (``decide_l4``) and for L7 (``decide_l7`` on an
admitted connection), plus load and compile times. L4 is measured twice: over a repeating mix of 4,096 requests
(what traffic looks like: decide_l4 remembers decisions per policy generation) and with that memo emptied before
every decision ("first time": the host/port index walk and the binary match). Target: a decision costs about the
same at 10 and 10,000 rules, L4 at most 10 µs and L7 about 20 µs at 10,000.

The agent's own protocols, at 10 and 1,000 rules (each rule an MCP endpoint with two tools and a read-only
GraphQL endpoint): an MCP ``tools/call`` decision (body route, JSON read, rule match) and a GraphQL decision on a
parsed document (target ≤ 50 µs), and the parse of a 2 KB GraphQL document, cold and through the cache.

    python3 bench/bench_policy.py [--decisions N] [--sizes 10,1000,10000]
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

import yaml

from supervisor.control.policy import (
    BinaryIdentity,
    L4Request,
    compile_policy,
    decide_l4,
    decide_l7,
    load_policy_text,
)


def build_policy(rules: int) -> str:
    body: dict[str, Any] = {}
    for i in range(rules):
        kind = i % 4
        if kind == 0:
            endpoints = [{"host": f"svc{i}.example{i % 97}.com", "port": 443}]
        elif kind == 1:
            endpoints = [{"host": f"*.api{i}.example.net", "ports": [443, 8443]}]
        elif kind == 2:
            endpoints = [{"host": f"**.cdn{i}.example.org", "port": 443}]
        else:
            endpoints = [
                {
                    "host": f"rest{i}.example.io",
                    "port": 443,
                    "protocol": "rest",
                    "enforcement": "enforce",
                    "access": "read-only",
                    "deny_rules": [{"method": "*", "path": "/admin/**"}],
                }
            ]
        binaries = [{"path": f"/usr/bin/tool{i % 50}"}]
        if i % 3 == 0:
            binaries.append({"path": f"/opt/app{i % 20}/bin/*"})
        body[f"rule-{i:05d}"] = {"endpoints": endpoints, "binaries": binaries}
    return yaml.safe_dump({"version": 1, "network_policies": body}, sort_keys=False)


def build_requests(rules: int, count: int, rng: random.Random) -> list[L4Request]:
    requests = []
    for _ in range(count):
        i = rng.randrange(rules)
        kind = i % 4
        host = (
            f"svc{i}.example{i % 97}.com",
            f"x.api{i}.example.net",
            f"a.b.cdn{i}.example.org",
            f"rest{i}.example.io",
        )[kind]
        roll = rng.random()
        if roll < 0.15:
            host = f"miss{i}.nowhere.example"  # no endpoint
        binary = f"/usr/bin/tool{i % 50}"
        if i % 3 == 0 and rng.random() < 0.3:
            binary = f"/opt/app{i % 20}/bin/worker"  # binary glob
        if 0.15 <= roll < 0.25:
            binary = "/usr/bin/intruder"  # binary miss
        requests.append(L4Request(host, 443, BinaryIdentity(binary, None, ("/bin/sh",))))
    return requests


def measure(rules: int, decisions: int) -> dict[str, float]:
    rng = random.Random(rules)
    text = build_policy(rules)
    started = time.perf_counter()
    policy = load_policy_text(text)
    loaded = time.perf_counter()
    compiled = compile_policy(policy)
    built = time.perf_counter()
    requests = build_requests(rules, 4096, rng)
    for req in requests[:512]:  # warm up
        decide_l4(compiled, req)
    n = 0
    allowed = 0
    t0 = time.perf_counter()
    while n < decisions:
        for req in requests:
            allowed += decide_l4(compiled, req).allowed
        n += len(requests)
    l4_elapsed = time.perf_counter() - t0
    # The same requests decided for the first time each: decide_l4's memo (per policy generation) emptied
    # before every decision, so each one walks the host/port index and matches binaries.
    memo = compiled.l4_memo
    cold = 0
    t_cold = time.perf_counter()
    while cold < decisions:
        for req in requests:
            memo.clear()
            decide_l4(compiled, req)
        cold += len(requests)
    l4_cold_elapsed = time.perf_counter() - t_cold

    rest = [d for d in (decide_l4(compiled, r) for r in requests) if d.l7]
    targets = [("GET", "/repos/a/b"), ("POST", "/repos/a"), ("GET", "/admin/x"), ("GET", "/a/../b?x=1")]
    m = 0
    t1 = time.perf_counter()
    while m < decisions // 4 and rest:
        for i, conn in enumerate(rest):
            method, target = targets[i % len(targets)]
            decide_l7(compiled, conn, method, target)
        m += len(rest)
    l7_elapsed = time.perf_counter() - t1
    return {
        "rules": rules,
        "load_s": loaded - started,
        "compile_s": built - loaded,
        "l4_us": l4_elapsed / n * 1e6,
        "l4_per_s": n / l4_elapsed,
        "l4_cold_us": l4_cold_elapsed / cold * 1e6,
        "l7_us": (l7_elapsed / m * 1e6) if m else float("nan"),
        "l7_per_s": (m / l7_elapsed) if m else float("nan"),
        "allowed_share": allowed / n,
    }


def build_protocol_policy(rules: int) -> str:
    body: dict[str, Any] = {}
    for i in range(rules):
        mcp = {"host": f"mcp{i}.example.com", "port": 443, "path": "/mcp", "protocol": "mcp",
               "enforcement": "enforce", "mcp": {"allow_all_known_mcp_methods": True},
               "rules": [{"allow": {"tool": {"any": [f"tool{i}_read", f"tool{i}_list"]}}}]}  # fmt: skip
        gql = {"host": f"gql{i}.example.com", "port": 443, "path": "/graphql", "protocol": "graphql",
               "enforcement": "enforce",
               "rules": [{"allow": {"operation_type": "query", "fields": ["viewer", "repo*"]}}],
               "deny_rules": [{"operation_type": "query", "fields": ["secret*"]}]}  # fmt: skip
        body[f"rule-{i:05d}"] = {"endpoints": [mcp, gql], "binaries": [{"path": f"/usr/bin/tool{i % 50}"}]}
    return yaml.safe_dump({"version": 1, "network_policies": body}, sort_keys=False)


def document_2k() -> str:
    """A query of about 2 KB: aliases, a fragment, nested selections."""
    parts = [f"r{i}: repository(owner: \"o{i}\", name: \"n{i}\") {{ ...Repo issues(first: 10) {{ nodes {{ id title "
             f"author {{ login }} }} }} }}" for i in range(18)]  # fmt: skip
    return "query Dashboard { viewer { login name } " + " ".join(parts) + " } fragment Repo on Repository { id name }"


def measure_protocols(rules: int, decisions: int) -> dict[str, float]:
    import json

    from supervisor.control.l7 import graphql
    from supervisor.control.l7.body import BodyRequest
    from supervisor.control.l7.body_decide import evaluate
    from supervisor.control.policy import body_route

    compiled = compile_policy(load_policy_text(build_protocol_policy(rules)))
    i = rules - 1
    who = BinaryIdentity(f"/usr/bin/tool{i % 50}", None)
    out: dict[str, float] = {"rules": rules}
    mcp_l4 = decide_l4(compiled, L4Request(f"mcp{i}.example.com", 443, who))
    call = json.dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                       "params": {"name": f"tool{i}_read", "arguments": {"path": "/x"}}}).encode()  # fmt: skip
    request = BodyRequest("POST", None, "application/json", False, call)
    doc = document_2k()
    gql_l4 = decide_l4(compiled, L4Request(f"gql{i}.example.com", 443, who))
    gql_request = BodyRequest("POST", None, "application/json", False, json.dumps({"query": doc}).encode())
    for name, l4, target, req in (("mcp", mcp_l4, "/mcp", request), ("graphql", gql_l4, "/graphql", gql_request)):
        route = body_route(compiled, l4, "POST", target)
        assert route is not None and evaluate(route, req).allowed, name
        count = max(decisions // 10, 1000)
        t0 = time.perf_counter()
        for _ in range(count):
            again = body_route(compiled, l4, "POST", target)
            assert again is not None
            evaluate(again, req)
        out[f"{name}_us"] = (time.perf_counter() - t0) / count * 1e6
    count = 300
    t0 = time.perf_counter()
    for _ in range(count):
        graphql.clear_cache()
        graphql.parse_document(doc)
    out["parse_cold_us"] = (time.perf_counter() - t0) / count * 1e6
    t0 = time.perf_counter()
    for _ in range(count * 10):
        graphql.parse_document(doc)
    out["parse_cached_us"] = (time.perf_counter() - t0) / (count * 10) * 1e6
    out["doc_bytes"] = len(doc.encode())
    return out


PROTOCOL_ROWS = (("mcp", "MCP tools/call decision", 50.0), ("graphql", "GraphQL decision on a parsed document", 50.0),
                 ("parse_cold", "GraphQL parse of a 2 KB document, cold", None),
                 ("parse_cached", "GraphQL parse of a 2 KB document, cached", None))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decisions", type=int, default=200_000)
    parser.add_argument("--sizes", default="10,1000,10000")
    parser.add_argument("--json", action="store_true", help="one JSON row per measurement (for bench/run.py)")
    parser.add_argument("--quick", action="store_true", help="fewer decisions per size")
    args = parser.parse_args()
    decisions = min(args.decisions, 20_000) if args.quick else args.decisions
    if args.json:
        import json

        for size in (int(s) for s in args.sizes.split(",")):
            r = measure(size, decisions)
            for kind, what in (("l4", "L4 decision"), ("l4_cold", "L4 decision, first time"), ("l7", "L7 decision")):
                target = {"l4": 10.0, "l4_cold": 10.0, "l7": 20.0}[kind] if size == 10_000 else None
                row = {"name": f"policy {what} at {size} rules", "unit": "µs", "value": round(r[f"{kind}_us"], 2)}
                print(json.dumps({**row, "target": target}))
        for size in (10, 1000):
            p = measure_protocols(size, decisions)
            for key, what, goal in PROTOCOL_ROWS:
                row = {"name": f"policy {what} at {size} rules", "unit": "µs", "value": round(p[f"{key}_us"], 2)}
                print(json.dumps({**row, "target": goal}))
        return
    print(
        f"{'rules':>6} {'load s':>7} {'compile s':>9} {'L4 µs':>7} {'L4 /s':>10} {'L4 1st µs':>9} {'L7 µs':>7} "
        f"{'L7 /s':>10} {'allowed':>7}"
    )
    for size in (int(s) for s in args.sizes.split(",")):
        r = measure(size, decisions)
        print(
            f"{r['rules']:>6} {r['load_s']:>7.2f} {r['compile_s']:>9.2f} {r['l4_us']:>7.2f} "
            f"{r['l4_per_s']:>10,.0f} {r['l4_cold_us']:>9.2f} {r['l7_us']:>7.2f} {r['l7_per_s']:>10,.0f} "
            f"{r['allowed_share']:>7.0%}"
        )
    print(f"\n{'rules':>6} {'MCP µs':>7} {'GraphQL µs':>10} {'parse cold µs':>13} {'parse cached µs':>15}")
    for size in (10, 1000):
        p = measure_protocols(size, decisions)
        print(f"{size:>6} {p['mcp_us']:>7.2f} {p['graphql_us']:>10.2f} {p['parse_cold_us']:>13.1f} "
              f"{p['parse_cached_us']:>15.2f}  ({p['doc_bytes']:.0f}-byte document)")  # fmt: skip


if __name__ == "__main__":
    main()

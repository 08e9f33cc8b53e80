"""Mediated egress end to end in dev mode: real clients as the agent, a real upstream on a test host in a
network namespace, names answered by the test's own DNS server. Allowed and denied by policy, events asserted.
Nothing leaves the machine: the only upstream is the test host, the only resolver the test's.
"""

from __future__ import annotations

import pytest

from tests.e2e.egress_world import OTHER_PORT, PORT, World, allowed_events, denied_events, world
from tests.host_proxy_port import model_p_proxy_port

__all__ = ["world"]  # the module-scoped fixture


@pytest.fixture(params=[1, 2], ids=lambda n: f"workers{n}")
def workers(request: pytest.FixtureRequest) -> tuple[str, ...]:
    """The matrix: each test runs with one control process and with two (docs/design.md "Worker processes")."""
    return (f"--workers={request.param}",)


def test_curl_through_the_proxy_plain_and_connect(world: World, workers: tuple[str, ...]) -> None:
    url = f"http://api.test:{PORT}"
    result, events = world.dev(
        f"curl -sS -f {url}/hello.txt && curl -sS -f -p {url}/blob.bin | sha256sum", options=workers
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[0] == "hello from the test host"
    assert lines[1].split()[0] == world.payload_sha256
    allowed = allowed_events(events)
    kinds = sorted(e["capture"] for e in allowed)
    assert kinds == ["connect", "http-forward"]
    for event in allowed:
        assert event["binary"] == "/usr/bin/curl"
        assert event["pid"] > 0 and event["start_time"] > 0  # the process instance: pid and start time
        assert event["rule"] == "test-api"
        assert event["resolved"] == world.host.address
        assert event["bytes_in"] > 0 and event["duration_ms"] > 0
    assert max(e["bytes_in"] for e in allowed) >= 3 * 1024 * 1024


def test_transparent_capture_resolves_through_control(world: World, workers: tuple[str, ...]) -> None:
    """A client that ignores the proxy env: DNS goes to the stub, the connection is captured transparently."""
    result, events = world.dev(f"curl -sS -f --noproxy '*' http://api.test:{PORT}/hello.txt", options=workers)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout == "hello from the test host\n"
    allowed = allowed_events(events)
    assert [e["capture"] for e in allowed] == ["transparent"]
    assert allowed[0]["name"] == "api.test" and allowed[0]["destination"].startswith(world.host.address)
    assert any(e.get("event") == "dns" and e.get("decision") == "answered" for e in events)


def test_python_urllib_and_git_clone(world: World, workers: tuple[str, ...]) -> None:
    script = (
        'python3 -c "import urllib.request; print(urllib.request.urlopen('
        f"'http://api.test:{PORT}/hello.txt', timeout=10).read().decode().strip())\" && "
        f"cd /tmp && git clone -q http://api.test:{PORT}/repo.git clone-$$ && cat clone-$$/README && rm -rf clone-$$"
    )
    result, events = world.dev(script, options=workers)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == ["hello from the test host", "cloned through the sandbox"]
    binaries = {e["binary"] for e in allowed_events(events)}
    assert "/usr/lib/git-core/git-remote-http" in binaries
    assert any(b.startswith("/usr/bin/python3") for b in binaries)


def test_denials_from_the_agents_side(world: World, workers: tuple[str, ...]) -> None:
    script = "; ".join([
        f"curl -s -o /dev/null -w '%{{http_code}}\\n' http://other.test:{PORT}/hello.txt",  # host not in policy
        f"curl -s -o /dev/null -w '%{{http_code}}\\n' -p http://other.test:{PORT}/hello.txt",  # CONNECT
        f"curl -s -m 5 --noproxy '*' http://{world.host.address}:{PORT}/hello.txt; echo direct=$?",  # IP literal
        f"python3 -c \"import urllib.request; urllib.request.urlopen('http://api.test:{OTHER_PORT}/hello.txt')\" "
        "2>&1 | grep -o 'HTTP Error 403' ",  # binary not allowed on that endpoint
        f"curl -s -m 5 --noproxy '*' http://{world.host.address}:22/; echo port22=$?",  # a port nobody allows
    ])  # fmt: skip
    result, events = world.dev(script, options=workers)
    lines = result.stdout.splitlines()
    assert lines[0] == "403", result.stderr[-3000:]
    assert lines[1] in ("403", "000")
    assert lines[2].startswith("direct=") and lines[2] != "direct=0"
    assert lines[3] == "HTTP Error 403"
    assert lines[4].startswith("port22=") and lines[4] != "port22=0"
    denied = denied_events(events)
    reasons = {e["reason"] for e in denied}
    assert "no-matching-endpoint" in reasons or "binary-not-allowed" in reasons
    assert any(e["destination"] == f"{world.host.address}:{PORT}" for e in denied), "the IP literal was decided"
    assert any(e["binary"].startswith("/usr/bin/python3") and e["reason"] == "binary-not-allowed" for e in denied)
    assert allowed_events(events) == []


def test_dns_for_names_no_endpoint_allows_is_refused(world: World, workers: tuple[str, ...]) -> None:
    before = world.dns.count("exfil.secret-data.example")
    script = (
        "python3 -c \"import socket\ntry:\n socket.getaddrinfo('exfil.secret-data.example', 80)\n"
        "except OSError as e:\n print('refused', e.errno)\""
    )
    result, events = world.dev(script, options=workers)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("refused")
    assert world.dns.count("exfil.secret-data.example") == before, "the name must never reach a resolver"
    assert any(e.get("event") == "dns" and e.get("decision") == "refused" for e in events)


def test_model_p_proxy_env_mediates_proxy_aware_clients(world: World, workers: tuple[str, ...]) -> None:
    """Model P (no namespaces, proxy-env acknowledged): the proxy listener lives on the pod's loopback and the
    same identity + decision path applies; a client ignoring the proxy is NOT fenced here (that is the external
    fence's job, documented), so only the mediated path is asserted."""
    script = f"curl -sS -f http://api.test:{PORT}/hello.txt && curl -s -o /dev/null -w '%{{http_code}}\\n' http://other.test:{PORT}/"
    with model_p_proxy_port():
        result, events = world.dev(script, options=("--privilege-model=P", "--acknowledge-external-fence", *workers))
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == ["hello from the test host", "403"]
    assert [e["capture"] for e in allowed_events(events)] == ["http-forward"]
    assert allowed_events(events)[0]["binary"] == "/usr/bin/curl"
    assert [e["destination"] for e in denied_events(events)] == [f"other.test:{PORT}"]


def test_model_p_needs_the_acknowledgement(world: World) -> None:
    result, _ = world.dev("true", options=("--privilege-model=P",))
    assert result.returncode == 2
    assert "--acknowledge-external-fence" in result.stderr

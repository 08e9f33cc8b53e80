"""The intercepted-HTTPS rows: the client's parsing and name check, the peers' configurations, the
sandbox's policy, the rows and their ratios, and one real origin on loopback verified (or refused) by the client."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.contenders import (
    FACTORIES,
    BenchContext,
    ContenderUnavailable,
    bump_config,
    mitmproxy_args,
    squid_bump_port,
)
from bench.harness import REPO, make_config
from bench.openshell import render_policy
from bench.origin import TlsMaterial, make_material
from bench.procstat import bound_sockets, start_time
from bench.report import HEADER, Results, build_rows
from bench.scenarios import INTERCEPT_REFERENCES, Config, Outcome, Probe, Scenario, build
from bench.setup_peers import MITMPROXY_REQUIREMENT, PEERS_VENV
from bench.tls_clients import check_address, https_download, https_setup_sequential, parse_head, request
from bench.wire import WireError
from supervisor.control.policy import compile_policy, load_policy_text

# --- the client's pure pieces -----------------------------------------------------------------------------------


def test_parse_head_waits_for_the_whole_head_then_splits_the_body() -> None:
    assert parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n") is None
    assert parse_head(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nX: y\r\n\r\nab") == (200, 5, b"ab")
    assert parse_head(b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n") == (503, 0, b"")


@pytest.mark.parametrize(
    "head",
    [b"SSH-2.0-OpenSSH\r\n\r\n", b"HTTP/1.1 OK\r\n\r\n", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"],
)
def test_parse_head_refuses_what_it_cannot_measure(head: bytes) -> None:
    with pytest.raises(WireError):
        parse_head(head)


def test_parse_head_bounds_a_head_that_never_ends() -> None:
    with pytest.raises(WireError, match="longer than"):
        parse_head(b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 20000)


def test_request_names_the_target_and_asks_the_origin_to_close() -> None:
    assert request(("192.0.2.2", 8443), "/small") == (
        b"GET /small HTTP/1.1\r\nHost: 192.0.2.2:8443\r\nConnection: close\r\n\r\n"
    )


def test_check_address_accepts_the_ip_san_and_squids_dns_form_only() -> None:
    check_address({"subjectAltName": (("IP Address", "192.0.2.2"),)}, "192.0.2.2")
    check_address({"subjectAltName": (("DNS", "192.0.2.2"),)}, "192.0.2.2")  # squid 5's bumped leaf
    for cert in ({"subjectAltName": (("IP Address", "192.0.2.3"),)}, {"subjectAltName": (("DNS", "other"),)}, {}):
        with pytest.raises(WireError, match="does not name"):
            check_address(cert, "192.0.2.2")


# --- the peers' configurations --------------------------------------------------------------------------------


def test_mitmproxy_listens_on_loopback_verifies_the_origin_and_streams() -> None:
    argv = mitmproxy_args(8080, Path("/run/x/confdir"), "/run/x/origin-ca.pem")
    assert argv[:4] == ["--listen-host", "127.0.0.1", "--listen-port", "8080"]
    options = {argv[i + 1] for i, word in enumerate(argv) if word == "--set"}
    assert {"confdir=/run/x/confdir", "ssl_verify_upstream_trusted_ca=/run/x/origin-ca.pem"} <= options
    assert "stream_large_bodies=1m" in options  # a download is relayed, never buffered whole
    assert MITMPROXY_REQUIREMENT.startswith("mitmproxy==")  # pinned


def test_squid_bump_mints_from_the_bump_ca_and_verifies_the_origin() -> None:
    port = squid_bump_port(3129, "/d/bump-ca.pem", "/d/bump-ca.key")
    assert port.startswith("http_port 127.0.0.1:3129 ssl-bump ")
    assert "tls-cert=/d/bump-ca.pem tls-key=/d/bump-ca.key generate-host-certificates=on" in port
    config = bump_config(Path("/d/ssl_db"), "/d/origin-ca.pem").splitlines()
    assert "sslcrtd_program /usr/lib/squid/security_file_certgen -s /d/ssl_db -M 16MB" in config
    # stare at both steps, then bump: the minted leaf mimics the origin's certificate
    assert (
        config.index("ssl_bump stare step1") < config.index("ssl_bump stare step2") < config.index("ssl_bump bump all")
    )
    assert "tls_outgoing_options cafile=/d/origin-ca.pem" in config


def test_the_client_trusts_the_bump_ca_for_the_peers_and_the_origin_ca_for_direct(tmp_path: Path) -> None:
    tls = TlsMaterial(*(tmp_path / n for n in ("oca", "oc", "ok", "bca", "bk", "bcomb")))
    ctx = BenchContext(tmp_path, tmp_path, 4096, tls=tls)
    assert FACTORIES["direct"](ctx).https_trust() == str(tmp_path / "oca")
    assert FACTORIES["mitmproxy"](ctx).https_trust() == str(tmp_path / "bca")
    assert FACTORIES["squid-bump"](ctx).https_trust() == str(tmp_path / "bca")
    assert FACTORIES["openshell"](ctx).https_trust() is None  # its agent's environment: the interception CA
    assert FACTORIES["mitmproxy"](ctx).paths == ("intercepted",)
    assert "intercepted" not in FACTORIES["tinyproxy"](ctx).paths


# --- the sandbox's policy ---------------------------------------------------------------------------------------


def test_sandbox_policy_intercepts_the_https_port_and_relays_the_rest() -> None:
    text = render_policy("192.0.2.2", [1000, 1001], "/usr/bin/python3.11", https_port=2000)
    compile_policy(load_policy_text(text, "bench.yaml"))  # valid
    raw, intercepted = text.split("      - host: ")[1:]
    assert "ports: [1000, 1001]" in raw and "tls: skip" in raw and "2000" not in raw
    assert "port: 2000" in intercepted and "protocol: rest" in intercepted and "tls: skip" not in intercepted
    assert "protocol" not in render_policy("192.0.2.2", [1000], "/usr/bin/python3.11")


# --- rows and ratios ------------------------------------------------------------------------------------------------


def _never(probe: Probe) -> Outcome:
    raise AssertionError("not measured in these tests")


def test_quick_has_one_intercepted_row_and_the_full_bench_two() -> None:
    quick, _ = make_config(True, 1, 65536)
    full, _ = make_config(False, 1, 65536)
    assert [s.name for s in build(quick) if s.path == "intercepted"] == ["intercepted setup"]
    assert [s.name for s in build(full) if s.path == "intercepted"] == ["intercepted setup", "intercepted bulk down"]
    assert all(s.references == INTERCEPT_REFERENCES for s in build(full) if s.path == "intercepted")


def test_intercepted_rows_carry_ratios_against_mitmproxy_and_squid_bump() -> None:
    config = Config(1, 1, 1, 1, 64, (), 1.0, 1.0, https_bulk_bytes=1)
    scenarios = [Scenario(s.name, s.kind, s.metrics, _never, s.path, s.references) for s in build(config)]
    contenders = ["direct", "openshell", "tinyproxy", "mitmproxy", "squid-bump"]
    results = Results(2, contenders, scenarios)
    for name, values in {"direct": (400.0, 500.0), "openshell": (100.0, 120.0), "mitmproxy": (50.0, 40.0),
                         "squid-bump": (200.0, 240.0)}.items():  # fmt: skip
        for run, value in enumerate(values):
            results.record("intercepted bulk down", "MB/s", name, run, value)
    for scenario in scenarios:
        if scenario.path == "intercepted":
            results.off_path.add((scenario.name, "tinyproxy"))
        else:
            results.off_path.update({(scenario.name, "mitmproxy"), (scenario.name, "squid-bump")})
    rows = build_rows(results)
    row = next(r for r in rows if (r.scenario, r.contender) == ("intercepted bulk down", "openshell"))
    mitm, bump = row.ratios["mitmproxy"], row.ratios["squid-bump"]
    assert mitm is not None and mitm.median == (2.0 + 3.0) / 2
    assert bump is not None and bump.median == 0.5
    assert "× mitmproxy" in HEADER and "× squid-bump" in HEADER
    # a row off a contender's path is absent, not "n/a"
    assert not [r for r in rows if r.contender == "tinyproxy" and r.scenario.startswith("intercepted")]
    assert not [r for r in rows if r.contender == "mitmproxy" and not r.scenario.startswith("intercepted")]
    raw = next(r for r in rows if (r.scenario, r.contender) == ("bulk up", "openshell"))
    assert "mitmproxy" not in raw.ratios  # the raw rows keep their two references


# --- a real origin ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def origin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[tuple[str, int], TlsMaterial]]:
    tls = make_material(tmp_path_factory.mktemp("tls"), "127.0.0.1")
    argv = [sys.executable, "-m", "bench.origin", "--cert", str(tls.origin_cert), "--key", str(tls.origin_key)]
    proc = subprocess.Popen(argv, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdin is not None
    words = proc.stdout.readline().split()
    try:
        assert words[0] == b"READY"
        yield ("127.0.0.1", int(words[1])), tls
    finally:
        proc.stdin.close()  # the origin exits when its stdin closes
        assert proc.wait(10) == 0


def test_the_client_measures_https_exchanges_and_a_download_against_the_origin(
    origin: tuple[tuple[str, int], TlsMaterial],
) -> None:
    address, tls = origin
    done = https_setup_sequential(None, address, str(tls.origin_ca), 5, timeout=10, budget=10)
    assert (len(done.latencies), done.errors) == (5, 0)
    assert https_download(None, address, str(tls.origin_ca), 3 << 20, timeout=10).size == 3 << 20


def test_the_client_refuses_an_origin_its_ca_did_not_sign(origin: tuple[tuple[str, int], TlsMaterial]) -> None:
    address, tls = origin
    done = https_setup_sequential(None, address, str(tls.bump_ca), 3, timeout=10, budget=10)
    assert not done.latencies and done.errors == 3
    assert all("CERTIFICATE_VERIFY_FAILED" in kind for kind in done.error_kinds)


@pytest.mark.parametrize("name", ["mitmproxy", "squid-bump"])
def test_intercepting_peer_bumps_on_loopback_only_and_leaves_nothing(
    name: str, tmp_path: Path, origin: tuple[tuple[str, int], TlsMaterial]
) -> None:
    address, tls = origin
    contender = FACTORIES[name](BenchContext(tmp_path, PEERS_VENV, 4096, tls=tls))
    try:
        proxy = contender.start()
    except ContenderUnavailable as exc:
        pytest.skip(f"{name} unavailable here: {exc}")
    try:
        assert proxy is not None and proxy[0] == "127.0.0.1"
        pids = contender.pids()
        assert all(s.address.is_loopback for s in bound_sockets(pids))
        trust = contender.https_trust()
        done = https_setup_sequential(proxy, address, trust, 3, timeout=10, budget=10)
        assert (len(done.latencies), done.errors) == (3, 0), done.error_kinds
        # it terminates TLS: trusting the origin's own CA instead fails (the leaf is the bump CA's)
        refused = https_setup_sequential(proxy, address, str(tls.origin_ca), 1, timeout=10, budget=10)
        assert refused.errors == 1 and "CERTIFICATE_VERIFY_FAILED" in next(iter(refused.error_kinds))
        started = {pid: start_time(pid) for pid in pids}
    finally:
        contender.stop()
    deadline = time.monotonic() + 10  # a helper killed by stop() may stay a zombie until its new parent reaps it
    while any(start_time(pid) == when for pid, when in started.items()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(start_time(pid) != when for pid, when in started.items()), "a peer process outlived stop()"

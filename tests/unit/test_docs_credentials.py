"""docs/policy.md "Credentials" and "Upstream trust" say what the product does: the example file loads, the field
table names exactly the keys the loader takes, and dev's upstream_tls_failed line is printed as shown."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from supervisor.cli.dev_console import Console
from supervisor.control import credentials
from supervisor.control.credentials import Credentials

DOC = (Path(__file__).resolve().parents[2] / "docs" / "policy.md").read_text()


def section(title: str) -> str:
    start = DOC.index(f"\n## {title}\n")
    end = DOC.find("\n## ", start + 1)
    return DOC[start:end]


def test_the_credentials_example_loads_and_binds_as_described() -> None:
    text = section("Credentials")
    example = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    creds = Credentials.from_mapping(yaml.safe_load(example), source="doc", environ={"GH_TOKEN": "ghp-x1234567890"})
    assert creds.placeholders() == {"GITHUB_TOKEN": "openshell:resolve:env:GITHUB_TOKEN",
                                    "PYPI_PASSWORD": "pypi-placeholder-0001"}  # fmt: skip
    assert creds.injects_at("api.github.com", 8443) and creds.injects_at("raw.githubusercontent.com", 443)
    assert not creds.injects_at("raw.githubusercontent.com", 80) and not creds.injects_at("github.com", 443)
    assert creds.injects_at("upload.pypi.org", 443) and not creds.injects_at("upload.pypi.org", 80)


def test_the_field_table_names_every_key_the_loader_takes() -> None:
    text = section("Credentials")
    rows = re.findall(r"^\| `([a-z_]+)` \|", text, re.MULTILINE)
    assert sorted(rows) == sorted(credentials._ENTRY_KEYS)
    [hosts_row] = [line for line in text.splitlines() if line.startswith("| `hosts` |")]
    binding = hosts_row.split("{", 1)[1].split("}", 1)[0]  # {host, port \| ports, path}
    assert set(re.findall(r"[a-z]+", binding)) == set(credentials._BINDING_KEYS)


def test_the_upstream_trust_line_is_what_dev_prints() -> None:
    shown = section("Upstream trust").split("```console\n", 1)[1].split("\n```", 1)[0]
    console = Console(sandbox="dev-1", policy=Path("/p.yaml"), policy_label="p.yaml", events_path=Path("/e"))
    [line] = console.lines_for({
        "event": "http", "component": "control", "decision": "error", "method": "GET",
        "destination": "api.corp.test:443", "binary": "/usr/bin/curl", "reason": "upstream-tls-failed",
        "detail": "the certificate of api.corp.test:443 failed verification: self-signed certificate in certificate "
        "chain",
    })  # fmt: skip
    assert line == shown

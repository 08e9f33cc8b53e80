"""``k8s render`` refuses what only the operator can state, as a user runs it (the real entrypoint in a subprocess).

Each statement has its refusal: the cluster's CIDRs (``--cluster-cidr``, or ``none``), NetworkPolicy enforcement
for model P and the proxy-pod topology (``--networkpolicy-enforced``), a mutable image
(``--allow-mutable-image``). A refusal exits 2 naming the flag, writes nothing, and mints nothing. Then what a
render tells the operator on stderr (the warning of a mutable image, the way to remove the sandbox) and
``--print-delete``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from .test_k8s_render_cli import AGENT, UID, run

IMAGE = "registry.example/agents/review-bot@sha256:" + "2d" * 32
WHO = ["k8s", "render", "--namespace", "agents-team-a", "--sandbox", "review-bot", "--sandbox-uid", UID]
IMAGES = ["--image", IMAGE, "--control-image", "registry.example/openshell/openshell-sandbox:0.1.0"]
CIDRS = ["--cluster-cidr", "10.244.0.0/16", "--service-cidr", "10.96.0.0/12"]


def refused(tmp_path: Path, args: list[str], flag: str, words: str) -> None:
    result = run(*WHO, *args, "--secrets-dir", "sec", *AGENT, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"k8s render: {flag}: ") and words in result.stderr, result.stderr
    assert result.stdout == "" and not (tmp_path / "sec").exists(), "nothing written, nothing minted"


@pytest.mark.parametrize("model", ["R", "U", "P"])
def test_without_the_clusters_ranges_render_refuses_to_guess(tmp_path: Path, model: str) -> None:
    args = [*IMAGES, "--privilege-model", model, "--networkpolicy-enforced"]
    refused(tmp_path, args, "--cluster-cidr", "render does not guess them")


@pytest.mark.parametrize("topology", [["--privilege-model", "P"], ["--topology", "proxy-pod"]])
def test_without_the_operators_statement_p_and_proxy_pod_are_refused(tmp_path: Path, topology: list[str]) -> None:
    refused(tmp_path, [*IMAGES, *CIDRS, *topology], "--networkpolicy-enforced", "CNI enforces NetworkPolicy")
    result = run(*WHO, *IMAGES, *CIDRS, *topology, "--networkpolicy-enforced", "--redact-secrets", *AGENT, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    for doc in yaml.safe_load_all(result.stdout):
        if doc:
            assert doc["metadata"]["annotations"]["openshell.ai/networkpolicy-enforced"]


def test_a_mutable_image_is_refused_unless_allowed_and_then_the_warning_says_what_is_lost(tmp_path: Path) -> None:
    tag = ["--image", "registry.example/agents/review-bot:1.0", "--control-image", "registry.example/osb:0.1.0"]
    refused(tmp_path, [*tag, *CIDRS], "--image", "is not pinned by digest")
    result = run(*WHO, *tag, *CIDRS, "--allow-mutable-image", "--redact-secrets", *AGENT, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "warning: --image registry.example/agents/review-bot:1.0 is a tag" in result.stderr
    assert "no longer proves which image was admitted" in result.stderr


def test_every_render_says_how_to_remove_the_sandbox_and_print_delete_prints_only_that(tmp_path: Path) -> None:
    pods = f"kubectl delete -n agents-team-a -l openshell.ai/sandbox-id={UID} pods,deployments"
    rest = (
        f"kubectl delete -n agents-team-a -l openshell.ai/sandbox-id={UID} services,networkpolicies,configmaps,secrets"
    )
    result = run(*WHO, *IMAGES, *CIDRS, "--redact-secrets", *AGENT, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"to remove this sandbox: {pods} --cascade=foreground --wait=true && {rest}" in result.stderr
    printed = run(*WHO, *IMAGES, *CIDRS, "--print-delete", *AGENT, cwd=tmp_path)
    assert printed.returncode == 0 and printed.stderr == "", printed.stderr
    assert printed.stdout == f"{pods} --cascade=foreground --wait=true && \\\n  {rest}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "nothing minted or written"

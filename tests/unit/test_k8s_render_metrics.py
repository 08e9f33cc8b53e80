"""``k8s render --metrics-port P --metrics-namespace NS``: control serves ``/metrics`` on a containerPort named
``metrics``, and its NetworkPolicy admits that port from the scraper's namespace only (docs/kubernetes.md
"Metrics"); without the flags control has no metrics port and no such rule."""

from __future__ import annotations

from typing import Any

import pytest

from supervisor.k8s.spec import Model, RenderError

from .test_k8s_render import SCHEMA_VERSIONS, daemon_args, kubernetes_validate, make_spec, needs_schemas, objects, one

SCRAPER = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}


@pytest.mark.parametrize("model", [Model.R, Model.P])
def test_the_metrics_port_is_named_and_admitted_from_the_scrapers_namespace_only(model: Model) -> None:
    docs = objects(model, metrics_port=9464, metrics_namespace="monitoring")
    control = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "metrics", "containerPort": 9464, "protocol": "TCP"} in control["ports"]
    assert daemon_args(control).metrics_listen == "*:9464"
    rules = one(docs, "NetworkPolicy", "os-npc-")["spec"]["ingress"]
    metrics_rules = [r for r in rules if {"protocol": "TCP", "port": 9464} in r.get("ports", [])]
    assert metrics_rules == [{"from": [SCRAPER], "ports": [{"protocol": "TCP", "port": 9464}]}]
    workload = one(docs, "NetworkPolicy", "os-np-")["spec"]["ingress"]
    assert all({"protocol": "TCP", "port": 9464} not in r.get("ports", []) for r in workload)


def test_without_the_flag_there_is_no_metrics_port() -> None:
    docs = objects(Model.R)
    control = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert not [a for a in control["args"] if a.startswith("--metrics-listen")]
    assert "metrics" not in [p["name"] for p in control.get("ports", [])]


@pytest.mark.parametrize(
    ("changes", "flag"),
    [
        ({"metrics_port": 9464}, "--metrics-namespace"),  # an unauthenticated port needs its one namespace
        ({"metrics_namespace": "monitoring"}, "--metrics-namespace"),  # needs --metrics-port
        ({"metrics_port": 9464, "metrics_namespace": "Mon!"}, "--metrics-namespace"),
        ({"metrics_port": 70000, "metrics_namespace": "monitoring"}, "--metrics-port"),
        ({"metrics_port": 7443, "metrics_namespace": "monitoring"}, "--metrics-port"),  # the boundary's port
        ({"metrics_port": 7444, "metrics_namespace": "monitoring", "api_listen": True}, "--metrics-port"),
    ],
)
def test_refused_metrics_flags(changes: dict[str, Any], flag: str) -> None:
    with pytest.raises(RenderError) as caught:
        make_spec(Model.R, **changes)
    assert caught.value.field == flag


@needs_schemas
def test_the_metrics_objects_validate() -> None:
    for doc in objects(Model.R, metrics_port=9464, metrics_namespace="monitoring"):
        kubernetes_validate.validate(doc, SCHEMA_VERSIONS[-1], strict=True)

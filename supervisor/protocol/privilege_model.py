"""The boundary's privilege models, named once (docs/design.md "Privilege models and what each protects").

The values are the letters of ``--privilege-model``, of ``attach`` and ``/v1/status``, and of ``k8s render``: a
``StrEnum`` so that a member is that letter on every wire and compares equal to it.
"""

from __future__ import annotations

import enum

__all__ = ["PrivilegeModel"]


class PrivilegeModel(enum.StrEnum):
    """What the boundary may do to confine the agent (docs/reference/boundary.md §2.9)."""

    R = "R"  # root with CAP_SYS_ADMIN and CAP_NET_ADMIN: the agent under another uid, in namespaces of its own
    U = "U"  # no capabilities: the agent in user, network, PID and mount namespaces the boundary owns
    P = "P"  # no namespace: the proxy variables only, behind a fence outside the pod (proxy-env)

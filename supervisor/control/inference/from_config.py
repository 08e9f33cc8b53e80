"""inference.local's router as control's configuration asks for it (one per control process: the daemon's and
each worker's, control/workers)."""

from __future__ import annotations

from supervisor.control.config import ControlConfig
from supervisor.control.inference.router import InferenceRouter
from supervisor.control.inference.store import RoutesStore


def inference_router(cfg: ControlConfig) -> InferenceRouter | None:
    """inference.local's router, when routes were given and TLS is intercepted (one per control process)."""
    if cfg.inference_routes is None or cfg.interception is None:
        return None
    store = RoutesStore(cfg.inference_routes, cfg.interception.credentials, cfg.log)
    store.watching = cfg.inference_watch_reason
    return InferenceRouter(store, credentials=cfg.interception.credentials, ca=cfg.interception.ca,
                           upstream_ssl=cfg.interception.upstream_ssl, upstream=cfg.upstream, log=cfg.log,
                           limits=cfg.inference_limits, relaxed=cfg.relaxed_identity)  # fmt: skip

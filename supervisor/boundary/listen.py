"""The boundary's listener: control dials and the boundary only listens (never ``SO_REUSEPORT``).

Every connection must complete a TLS 1.3 handshake within a deadline and present a control certificate whose
claims equal ours exactly; anything else is logged with the peer and the failing field and closed, and the daemon
keeps serving. An accepted connection becomes the ops link (control's operations, served by the daemon's router)
or an egress link (the captured connections, once the lifecycle allows them).
"""

from __future__ import annotations

from typing import Any

import trio

from supervisor.boundary.state import DaemonState
from supervisor.link.h2link import Link
from supervisor.link.tls_link import Refused, accept_link, refuse
from supervisor.protocol.errors import OpError
from supervisor.protocol.event_names import EventName
from supervisor.protocol.lifecycle import Op
from supervisor.protocol.tls import ALPN_OPS


async def open_listeners(state: DaemonState) -> list[trio.SocketListener]:
    """Listen on the configured address (and say where: the port file, the ``boundary.listening`` event)."""
    cfg = state.cfg
    # "::" (the default, [::]:7443) means every address of both families: trio then binds 0.0.0.0 and a
    # v6-only ::, and skips the family a v6-less (or v4-less) pod does not have. Dual-stack clusters work.
    host = None if cfg.listen_host in ("::", "") else cfg.listen_host
    listeners = await trio.open_tcp_listeners(cfg.listen_port, host=host)
    port = listeners[0].socket.getsockname()[1]
    if cfg.port_file is not None:
        tmp = cfg.port_file.with_suffix(".tmp")
        tmp.write_text(str(port))
        tmp.rename(cfg.port_file)
    state.log.emit(
        EventName.BOUNDARY_LISTENING,
        address=f"{cfg.listen_host}:{port}",
        privilege_model=cfg.privilege_model,
        model_reason=cfg.model_reason,
        instance=state.instance,
    )
    return listeners


async def serve_connection(state: DaemonState, stream: trio.SocketStream, ctx: Any) -> None:
    """One connection from control, from its handshake to its link's end."""
    try:
        tls, claims, alpn = await accept_link(stream, ctx, state.cfg.bundle)
    except Refused as exc:
        state.log.emit(EventName.LINK_REFUSED, peer=exc.peer, field=exc.field, reason=exc.reason)
        return
    peer = f"{claims.control_deployment}"
    if alpn == ALPN_OPS:
        link = Link(tls, client=False, handler=state.router.handle, name=f"ops:{peer}")
    else:
        try:
            state.lifecycle.check(Op.EGRESS)
        except OpError as exc:
            state.log.emit(EventName.LINK_REFUSED, peer=peer, field="state", reason=f"egress link: {exc.reason}")
            await refuse(tls, server=True, field="state")  # control is told why (a GOAWAY)
            return
        # On egress links the boundary is the HTTP/2 client (HTTP/2 roles do not follow TCP's).
        link = Link(tls, client=True, name=f"egress:{peer}")
        state.egress_links.add(link)
    state.links.add(link)
    state.log.emit(EventName.LINK_UP, peer=peer, alpn=alpn, links=len(state.links))
    try:
        await link.run()
    finally:
        state.links.discard(link)
        state.egress_links.discard(link)
        state.log.emit(EventName.LINK_DOWN, peer=peer, alpn=alpn, reason=link.close_reason, links=len(state.links))

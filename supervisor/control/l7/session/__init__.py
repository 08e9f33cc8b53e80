"""One inspected connection: terminate TLS if asked, then judge and forward HTTP/1.1 requests one by one.

The phases of one connection, a module each, share its state through :class:`state.Session` (the streams, the
idle clock, the policy generation, the I/O with deadlines and the events):

- ``entry``: :func:`inspect`, what the listener calls, and the loop over requests between policy revisions;
- ``opening``: what is spoken (sniffing), the ClientHello's server name, TLS toward the agent, the raw relay;
- ``request``: each request's head, its checks and decision, and the credential rewrite of what is forwarded;
- ``request_body``: a body read whole, to decide it (JSON-RPC, MCP, GraphQL) or to sign it;
- ``upstream``: the upstream connection and the exchange of one request and its answer over it;
- ``response``: the response relayed to the agent, scrubbed of any secret it echoes;
- ``upgrade``: the relay after a ``101`` and its WebSocket message filters;
- ``refusal``: the answers that refuse a request and end the connection.

The pure pieces are beside the package (record, answers, rewrite, websocket, sniff; request heads:
protocol/request_head).

Theory of operation
-------------------
``inspect`` serves the agent's side of one connection that control has already admitted at L4, on any
endpoint but ``tls: skip``. It owns both streams from then on.

1. **What is spoken** (§3.7). The caller says TLS or plaintext, or leaves it to the first bytes (``sniff``,
   waiting up to the head timeout while they are ambiguous). h2c prior knowledge is refused with ``403
   unsupported_l7_protocol``; bytes that are neither TLS nor HTTP too, except on endpoints without L7 rules
   (``raw_fallback``), where they — and connections whose origin speaks first — are relayed raw.
2. **TLS toward the agent**: the whole ClientHello is read first; its SNI must name the tunnel's host (or, for
   a transparent capture, a name issued for its address: ``choose_name``). It is terminated with a leaf for
   that host from the sandbox CA; TLS toward the upstream is opened for the first admitted request, and
   always verified (``upstream_tls``).
3. **Each request** (§3.12), on a kept-alive connection, in order: raw head validation (``protocol/request_head``: the
   smuggling shapes h11 tolerates) → h11 parse → authority binding (``authority``) → protocol checks (CONNECT,
   h2c and non-websocket upgrades refused) → canonical target, placeholders redacted → ``decide_l7`` (allow,
   audit, deny) → credential rewrite (``rewrite``, only now, scoped to this endpoint) → upstream write. A
   refusal answers with the catalogue's JSON body and closes the connection; a parse error closes it without
   a response. One JSON event per request, never with a secret or a query string in it.
4. **Bodies stream** through both h11 state machines with one bounded chunk in flight per direction; the
   request body and the response are pumped concurrently (an upstream may answer before the upload ends,
   ``100 Continue`` passes through). Responses from a host a credential is bound to carry its placeholder
   where the secret was echoed — reason phrase, header names and values, ``1xx`` heads, body (``scrub``);
   requests there go without ``Range``/``If-Range`` and ask for identity encoding, and a ``206``, a compressed
   body or a secret in a header name is answered ``502`` instead. A ``101`` to a websocket upgrade (allowed on
   endpoints without L7 rules and on ``protocol: websocket`` ones) turns the rest of the connection into a raw
   relay. The connection is idle only when no byte moved either way for the idle timeout (``idle``).
5. **Between requests** the policy generation is checked: a revision re-decides the connection
   (``current``) and closes it only if the new generation denies it (§3.15); an upstream connection that
   cannot be reused is dropped and a new one dialled for the next request (a reused one that fails before
   any response byte is retried once for a bodiless request).
"""

"""Egress capture inside the agent's network namespace (docs/reference/boundary.md §4, §5.4).

- :mod:`.setup` runs in the launcher inside the agent's namespace: ``prepare`` (lo, any-IP routes, listeners
  as fds), ``inspect`` (fence read-back + fingerprint), ``probe``, ``open_sock_diag``; it pulls in pyroute2
  when called. :mod:`.fence_dump` types the fence it reads back; :mod:`.readback` is what the boundary reads of
  ``inspect``'s and ``probe``'s answers.
- :mod:`.identity` resolves the binary behind an accepted connection (the boundary, before reading a byte).
- The proxy listener's head parser and answers live in :mod:`supervisor.protocol.proxy_head` (shared with
  control's proxy-pod listener).
- :mod:`.dns_stub` frames DNS over TCP and answers SERVFAIL without control; control decides every query.

Nothing is imported here: the launcher imports :mod:`.setup` alone, before the event loop and inside the
agent's namespaces, and must not pull in dnspython, trio or the identity resolver with it.
"""

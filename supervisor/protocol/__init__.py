"""Shared by both daemons: claims, TLS contexts, wire messages, channel framing, error kinds. No I/O loops."""

"""Egress capture inside the agent's network namespace (spec/boundary.md §4, §5.4)."""

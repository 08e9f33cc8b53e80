"""Boundary: the unprivileged side that owns the workload and captures its egress."""

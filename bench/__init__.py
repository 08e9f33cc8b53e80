"""Benchmark harness: the sandbox's egress path against a direct connection and peer proxies.

Entry point: ``python3 bench/run.py [--quick] [--runs N] [--out DIR]`` (see docs/performance.md).
"""

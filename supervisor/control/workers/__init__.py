"""Control's worker processes (``--workers N|auto``; docs/design.md "Worker processes").

The first process (the primary) keeps everything a sandbox has one of: the operator API, the ops link, the policy
store and its file watch, the TOFU pins, the map of addresses its DNS answers issued, the events and metrics. Every
process, the primary included, serves whole egress connections. A worker holds a copy of the policy that the
primary publishes to it, and asks the primary about pins and issued names; it decides nothing looser than one
control would.
"""

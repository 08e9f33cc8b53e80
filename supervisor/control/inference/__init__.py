"""``inference.local``: model API calls answered by control with the operator's backend and key (``router``), from
the routes file (``routes``, ``store``), in the request shapes of docs/reference/policy.md §3.16 (``shapes``)."""

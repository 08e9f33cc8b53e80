"""Kubernetes objects of one sandbox, rendered by the product (docs/kubernetes.md; docs/design.md "Settled
details": Kubernetes objects). Pure functions from a checked ``RenderSpec`` (``spec``) to plain dicts
(``objects``, ``secrets``), named by ``names`` and put together by ``render``; nothing is imported here so that
the CLI's parser stays cheap to build."""

"""tests/k8s runs only under ``make test-k8s`` (OPENSHELL_TEST_K8S=1): it installs nothing itself but builds an
image, creates a podman network and runs real pods, minutes of work that ``make test`` must not do."""

import os

collect_ignore_glob = [] if os.environ.get("OPENSHELL_TEST_K8S") == "1" else ["test_*.py"]

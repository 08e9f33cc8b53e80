"""``python -m supervisor.cli``: the same entrypoint as the ``openshell-sandbox`` console script."""

import sys

from supervisor.cli.main import main

sys.exit(main())

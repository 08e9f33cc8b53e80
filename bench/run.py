"""Entry point: ``python3 bench/run.py [--quick] [--runs N] [--out DIR] [--profile CONTENDER]``."""

import sys
from pathlib import Path

# Run as a script, Python puts bench/ itself first on sys.path, where our module names could shadow
# others; put the repository there instead so that everything is imported as ``bench.*``.
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from bench.harness import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())

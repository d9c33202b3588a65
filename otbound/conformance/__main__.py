"""``python -m otbound.conformance``: check a verifier for losslessness.

The entry of the command :mod:`otbound.cli.conformance`.
"""

import sys

from otbound.cli.conformance import main

if __name__ == "__main__":
    sys.exit(main())

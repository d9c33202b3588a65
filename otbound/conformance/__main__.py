"""``python -m otbound.conformance``: check a verifier for losslessness (the command is
:mod:`otbound.cli.conformance`)."""

import sys

from otbound.cli.conformance import main

if __name__ == "__main__":
    sys.exit(main())

"""``python -m otbound.compare``: every verifier against its optimal-transport bound.

The entry of the command :mod:`otbound.cli.compare`.
"""

from otbound.cli.compare import main

if __name__ == "__main__":
    main()

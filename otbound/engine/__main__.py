"""``python -m otbound.engine``: audit a serving engine's speculative decoding.

The entry of the command :mod:`otbound.cli.engine`.
"""

from otbound.cli.engine import main

if __name__ == "__main__":
    main()

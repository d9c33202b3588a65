"""``python -m otbound.plan``: plan the drafting scheme of a pair.

The entry of the command :mod:`otbound.cli.plan`.
"""

from otbound.cli.plan import main

if __name__ == "__main__":
    main()

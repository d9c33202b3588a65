"""``python -m otbound.engine``: audit a serving engine's speculative decoding through its own API (the
command is :mod:`otbound.cli.engine`)."""

from otbound.cli.engine import main

if __name__ == "__main__":
    main()

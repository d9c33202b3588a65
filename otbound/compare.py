"""``python -m otbound.compare``: every verifier against its optimal-transport bound (the command is
:mod:`otbound.cli.compare`)."""

from otbound.cli.compare import main

if __name__ == "__main__":
    main()

"""Lets ``python -m highwater`` run the ``highwater`` command line."""

from highwater.cli.main import main

if __name__ == "__main__":
    main(prog_name="highwater")

"""The command line: `python -m symkern demo | inspect | doctor | bench`.

Imports symkern's own modules lazily, per command.
"""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m symkern", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo", help="build the demo kernels, print their stages, run them")
    arguments = parser.parse_args(argv)
    if arguments.command == "demo":
        from symkern.demo import main as demo

        return demo()
    parser.error(f"unknown command {arguments.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())

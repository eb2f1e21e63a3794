"""The ``refkern`` command."""

import argparse
import sys

from refkern._version import __version__


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="refkern",
        description="Exact reference kernels: is a numerical difference rounding, reduced precision, or a bug?",
    )
    p.add_argument("--version", action="version", version=f"refkern {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    d = sub.add_parser("demo", help="run the classic discrepancy cases and print the verdicts")
    d.add_argument("--seed", type=int, default=0, help="seed of the random cases (default 0)")
    return p


def main(argv=None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    if args.command is None:
        p.print_help()
        return 2
    if args.command == "demo":
        from refkern import demo

        return 1 if demo.run(seed=args.seed) else 0
    return 2  # unreachable: argparse rejects unknown commands


if __name__ == "__main__":
    sys.exit(main())

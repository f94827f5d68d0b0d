"""The ``hookviz`` parser and ``main``: the subcommands, their options and help, and the one-line error handling.

Mistakes on the command line (an unknown method or model, a missing file, a bad target) end with exit code 2 and
one line on stderr, ``hookviz explain: error: ...``, never a traceback.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from . import concepts, dataset, demo, evaluate, explain, features, generation, report
from .common import UsageError


class _Parser(argparse.ArgumentParser):
    """argparse with its errors (a bad ``--size``, a missing ``--model``) as one line, like hookviz's own."""

    def error(self, message: str) -> Any:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# one entry per command: its module's add_parser adds the subcommand (a new command plugs in with one line)
COMMANDS = (demo, explain, dataset, evaluate, features, generation, report, concepts)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="hookviz", description="Interpretability for PyTorch, built on hooks.")
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``hookviz`` console script."""
    parser = _parser()
    args = parser.parse_args(argv)
    if hasattr(args, "run"):
        try:
            return args.run(args)
        except UsageError as exc:
            message = str(exc)
        except (TypeError, ValueError, FileNotFoundError, IsADirectoryError) as exc:
            # hookviz's own checks (an out-of-range target, an unreadable image) already say what to fix
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        parser.exit(2, f"hookviz {args.command}: error: {message}\n")
    parser.error(f"unknown command {args.command!r}")
    return 2

"""`rltune` command line (DESIGN.md, "Command line"). One module per command.

Each command module exposes `register(subparsers)`, which adds its parser and
sets `func` to a callable `(args) -> int`. Errors a user can cause raise
`UserError` and become one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from shared.errors import UserError

__all__ = ["main"]

# command name -> module under rltune that registers it
COMMANDS = {
    "up": "up",
    "broker": "broker",
    "service": "service",
    "submit": "submit",
    "metrics": "metrics",
    "simulate": "simulate",
    "train": "train",
    "eval": "evaluate",
    "bench": "bench",
    "why": "why",
    "jobs": "jobs",
    "whatif": "whatif",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        """One line and exit 2, like every other user mistake."""
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="rltune", description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for module in COMMANDS.values():
        try:
            mod = importlib.import_module(f"rltune.{module}")
        except ModuleNotFoundError as exc:
            if exc.name != f"rltune.{module}":
                raise
            continue  # a command whose module is not built yet is simply absent
        mod.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from shared.health import quiet_aiokafka

    quiet_aiokafka(announce=False)  # a command says itself what failed
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"rltune {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (`rltune metrics --follow | head`)
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # (exit's flush)
        return 141


if __name__ == "__main__":
    sys.exit(main())

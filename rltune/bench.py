"""`rltune bench NAME [ARGS...]`: run the benchmark module `bench/NAME.py`."""

from __future__ import annotations

import argparse
import importlib
import pkgutil

import bench as bench_pkg
from shared.errors import UserError


def available() -> list[str]:
    return sorted(
        m.name for m in pkgutil.iter_modules(bench_pkg.__path__) if not m.name.startswith("_")
    )


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench", help=f"run a benchmark ({len(available())} of them: `rltune bench --help`)"
    )
    p.add_argument("name", help="benchmark name: " + ", ".join(available()))
    p.add_argument("rest", nargs=argparse.REMAINDER, help="the benchmark's own arguments")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.name not in available():
        raise UserError(f"no benchmark {args.name!r}; choose from {', '.join(available())}")
    mod = importlib.import_module(f"bench.{args.name}")
    return int(mod.main(list(args.rest)) or 0)

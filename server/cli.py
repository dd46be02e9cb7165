"""The `pandora` command: one entry point, one subcommand per role.

Each package contributes its own subcommands through a ``register(subparsers)`` function in
a small module that imports nothing heavy at import time, so `pandora replay` works on an
install without the web stack and `pandora serve` starts without importing torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Modules that contribute subcommands, in the order `pandora --help` lists them.
SUBCOMMAND_MODULES = (
    "server.serve_cli",
    "reward.cli",
    "stoppers.replay.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pandora",
        description="Adaptive Best-of-N gateway: optimal stopping instead of a fixed N.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            # Only tolerate the subcommand module itself being absent, never a broken import.
            if exc.name is None or not module_name.startswith(exc.name):
                raise
            continue
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())

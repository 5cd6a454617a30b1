"""``python -m petmodel``: train, generate, evaluate, runs, the studies' sweep and search, and data.

Expected failures print one sentence to stderr and exit 1 (2 for bad usage) with no
traceback; ``--json`` prints one JSON object as the last line of stdout for scripts.
Modules: ``args`` (what the commands share), ``run_commands`` (train, generate, evaluate,
runs), ``study_commands`` (sweep, search), ``data_commands`` (data show, data refresh), ``json_rows``
and ``json_schema`` (the ``--json`` results: built once, declared once, in ``docs/JSON.md``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from petmodel import __version__
from petmodel.cli.data_commands import add_data_commands
from petmodel.cli.json_rows import json_line
from petmodel.cli.plan_command import add_plan_command
from petmodel.cli.run_commands import add_run_commands
from petmodel.cli.signals import Interrupted
from petmodel.cli.study_commands import add_study_commands
from petmodel.errors import PetmodelError, UsageError

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command; each subcommand sets ``handler``, the function that runs it."""
    parser = argparse.ArgumentParser(prog="python -m petmodel",
                                     description="Train a character-level LSTM that invents pet names, "
                                                 "on this machine or on a Dask cluster with DDP.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")  # none given: the help, as git and pip do
    add_run_commands(sub)
    add_study_commands(sub)
    add_plan_command(sub)
    add_data_commands(sub)
    return parser


def os_error_sentence(err: OSError, keep: int = 60) -> str:
    """One sentence for a path the system refused (too long, not allowed, …), the path cut to ``keep`` characters."""
    name = str(err.filename)
    if len(name) > keep:
        name = f"{name[:keep // 2]}…{name[-keep // 2:]}"
    return f"The path {name} cannot be used ({err.strerror or type(err).__name__}); check it and try again."


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; its exit code (argparse exits with 2 itself on malformed flags)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        result = args.handler(args)
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except Interrupted as err:
        print(f"Interrupted: {err}", file=sys.stderr)
        return 130
    except PetmodelError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except OSError as err:
        if err.filename is None:
            raise  # not about a path the user gave: a bug worth its traceback
        print(f"error: {os_error_sentence(err)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted; the run is marked cancelled in the store (its last periodic snapshot, if "
              "any, can be resumed with `python -m petmodel train --resume RUN_ID`).", file=sys.stderr)
        return 130
    if args.json:
        print(json_line(result))  # strict JSON: NaN as null (docs/JSON.md has every command's fields)
    return 0

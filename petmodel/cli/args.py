"""What every command shares: number checks for flags, the run options, the run store.

Every training default comes from :data:`petmodel.config.DEFAULT_SPEC`; the flags here only
name them (and their help shows them), so a default is written in one place.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from petmodel.config import DEFAULT_SPEC, PRECISIONS, WANDB_MODES, RunSpec, parse_list
from petmodel.errors import UsageError

if TYPE_CHECKING:
    from petmodel.store import RunStore


def _number_type(kind: type, *, above: float, inclusive: bool, rule: str) -> Callable[[str], Any]:
    """An argparse ``type=`` for one finite ``kind`` (int or float) at least (or above) ``above``."""
    what = "a whole number" if kind is int else "a number"

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not (math.isfinite(value) and (value >= above if inclusive else value > above)):
            raise argparse.ArgumentTypeError(f"must be {rule}, got {text.strip() if kind is float else value}")
        return value

    return parse


positive_int = _number_type(int, above=1, inclusive=True, rule="≥ 1")
positive_float = _number_type(float, above=0, inclusive=False, rule="a positive number")
non_negative_int = _number_type(int, above=0, inclusive=True, rule="≥ 0")
non_negative_float = _number_type(float, above=0, inclusive=True, rule="a number ≥ 0")


def _list_type(kind: type) -> Callable[[str], list]:
    """An argparse ``type=`` for comma-separated numbers, through the one parser the app uses too."""
    def parse(text: str) -> list:
        try:
            return parse_list(text, "The values", kind)
        except UsageError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    parse.__name__ = f"{kind.__name__} list"  # argparse names the type in its own messages
    return parse


int_list = _list_type(int)
float_list = _list_type(float)


def csv(values: Any) -> str:
    """Numbers as a flag takes them (``0.003,0.006``), for help texts."""
    return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)


def add_store_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", metavar="DIR", help="run store folder (default: $PETMODEL_STORE or the user data folder)")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")


def add_run_options(p: argparse.ArgumentParser, *, default_seconds: float | None) -> None:
    """Options shared by train, sweep and search; ``default_seconds`` is the budget without --epochs."""
    d = DEFAULT_SPEC
    p.add_argument("--data", metavar="PATH", help="CSV (or .csv.gz) with an \"Animal's Name\"/name column, or a text "
                   "file of names (default: $PETMODEL_DATA, else the export `data refresh` cached, else the "
                   "Seattle snapshot packaged with petmodel)")
    p.add_argument("--epochs", type=positive_int, help="stop after N epochs")
    p.add_argument("--max-seconds", type=positive_float, metavar="S",
                   help=f"stop after S seconds of training (default {default_seconds:g} without --epochs)")
    p.add_argument("--embed", type=positive_int, default=d.embed, help="embedding size (default %(default)s)")
    p.add_argument("--hidden", type=positive_int, default=d.hidden, help="LSTM hidden size (default %(default)s)")
    p.add_argument("--layers", type=positive_int, default=d.layers, help="LSTM layers (default %(default)s)")
    p.add_argument("--dropout", type=float, default=d.dropout, help="dropout in [0, 1) (default %(default)s)")
    p.add_argument("--seed", type=int, default=d.train.seed, help="random seed (default %(default)s)")
    p.add_argument("--precision", choices=PRECISIONS, default=d.train.precision,
                   help="bf16 autocast or fp32 (default %(default)s)")
    p.add_argument("--scheduler", metavar="ADDRESS", help="Dask scheduler address or scheduler file "
                   "(default: an embedded local cluster)")
    p.add_argument("--connect-timeout", type=positive_float, default=10.0, metavar="S",
                   help="give up on --scheduler after S seconds at each step of connecting (default %(default)g)")
    p.add_argument("--tls-ca-file", metavar="PATH", help="CA certificate for a tls:// scheduler "
                   "(default: $PETMODEL_TLS_CA_FILE)")
    p.add_argument("--tls-cert", metavar="PATH", help="this client's TLS certificate (default: $PETMODEL_TLS_CERT)")
    p.add_argument("--tls-key", metavar="PATH", help="this client's TLS private key (default: $PETMODEL_TLS_KEY)")
    p.add_argument("--threads-per-worker", type=positive_int, default=1,
                   help="torch threads per worker of the embedded local cluster (default %(default)s)")
    p.add_argument("--wandb", choices=WANDB_MODES, default=d.wandb_mode,
                   help="Weights & Biases tracking (default %(default)s)")
    p.add_argument("--wandb-project", default=d.wandb_project, metavar="NAME",
                   help="W&B project (default %(default)s)")
    add_store_options(p)


def spec_from_args(args: argparse.Namespace, *, default_seconds: float | None = None, **changes: Any) -> RunSpec:
    """The run spec of the shared run options, with ``changes`` (``lr=…``, ``workers=…``) on top.

    Without --epochs and --max-seconds a run trains for ``default_seconds`` (the default
    run's budget when None).
    """
    max_seconds = args.max_seconds
    if args.epochs is None and max_seconds is None:
        max_seconds = default_seconds if default_seconds is not None else DEFAULT_SPEC.train.max_seconds
    return DEFAULT_SPEC.with_(
        epochs=args.epochs, max_seconds=max_seconds, seed=args.seed, precision=args.precision,
        embed=args.embed, hidden=args.hidden, layers=args.layers, dropout=args.dropout, data=args.data,
        wandb_mode=args.wandb, wandb_project=args.wandb_project, **changes)


def connect_from_args(args: argparse.Namespace) -> Any:
    """A client for --scheduler, with the TLS files of the flags or the ``PETMODEL_TLS_*`` variables."""
    from petmodel.cluster.connect import connect
    from petmodel.cluster.security import security_from

    return connect(args.scheduler, timeout=args.connect_timeout,
                   security=security_from(args.tls_ca_file, args.tls_cert, args.tls_key))


def open_store(path: str | None) -> RunStore:
    """The run store at ``path`` (or the default one), with runs and studies of dead processes marked failed."""
    from petmodel.store import RunStore, default_store_dir

    store = RunStore(path or default_store_dir())
    store.reconcile_orphans()
    return store


def say(args: argparse.Namespace, text: str) -> None:
    """A progress line on stderr, unless the output is JSON for a script."""
    if not args.json:
        print(text, file=sys.stderr)

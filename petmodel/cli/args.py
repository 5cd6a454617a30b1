"""What every command shares: number checks for flags, the run options, the run store.

Every training default comes from :data:`petmodel.config.DEFAULT_SPEC`; the flags here only
name them (and their help shows them), so a default is written in one place.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path
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


def add_store_options(p: argparse.ArgumentParser, *, subcommand: bool = False) -> None:
    """``--store`` and ``--json``. On a subcommand of ``runs`` (``subcommand=True``) they default to SUPPRESS,
    so given before it (``runs --store X delete ID``) they are not overwritten by the subcommand's defaults."""
    unset = {"default": argparse.SUPPRESS} if subcommand else {}
    p.add_argument("--store", metavar="DIR", help="run store folder (default: $PETMODEL_STORE or the user data folder)",
                   **unset)
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line", **unset)


def add_run_options(p: argparse.ArgumentParser, *, default_seconds: float | None, trains: bool = True) -> None:
    """Options shared by train, sweep, search and plan; ``default_seconds`` is the budget without --epochs.

    ``trains=False`` (plan: it trains nothing it keeps) leaves out the budget and W&B flags."""
    d = DEFAULT_SPEC
    p.add_argument("--data", metavar="PATH", help="CSV (or .csv.gz) with an \"Animal's Name\"/name column, or a text "
                   "file of names (default: $PETMODEL_DATA, else the export `data refresh` cached, else the "
                   "Seattle snapshot packaged with petmodel)")
    if trains:
        p.add_argument("--epochs", type=positive_int, help="stop after N epochs")
        p.add_argument("--max-seconds", type=positive_float, metavar="S",
                       help=f"stop after S seconds of training (default {default_seconds:g} without --epochs)")
    else:
        p.set_defaults(epochs=None, max_seconds=None, wandb="disabled", wandb_project=d.wandb_project)
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
    p.add_argument("--gateway", nargs="?", const="", metavar="URL",
                   help="train on a Dask Gateway cluster: create one (scaled to the workers needed, shut down at "
                        "the end), or use --gateway-cluster; URL defaults to $DASK_GATEWAY__ADDRESS, and the login "
                        "to dask-gateway's auth config ($DASK_GATEWAY__AUTH__KWARGS__USERNAME / __PASSWORD)")
    p.add_argument("--gateway-cluster", metavar="NAME", help="with --gateway: use this running cluster of yours "
                   "(it keeps running) instead of creating one")
    p.add_argument("--keep-cluster", action="store_true", help="with --gateway: leave the cluster it created "
                   "running at the end (its name is printed)")
    p.add_argument("--threads-per-worker", type=positive_int, default=1,
                   help="torch threads per worker of the embedded local cluster (default %(default)s)")
    if trains:
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


def gateway_login(args: argparse.Namespace) -> Any:
    """The --gateway login (a :class:`~petmodel.cluster.gateway.GatewayClient`), checked now: a wrong
    password or no gateway is one sentence before anything slow (torch, the data) loads."""
    from petmodel.cluster.gateway import open_gateway

    return open_gateway(args.gateway or None, timeout=args.connect_timeout)


def remote_from_args(args: argparse.Namespace, workers: int, *, login: Any = None) -> Any:
    """A client for --scheduler or --gateway, else None (the caller starts the embedded cluster).

    With --gateway: a new gateway cluster (or --gateway-cluster's) scaled to ``workers`` and waited
    for; closing the client shuts a cluster made here down, unless --keep-cluster. ``login``: the
    one :func:`gateway_login` made (closed here), else one is made now.
    """
    url = getattr(args, "gateway", None)
    if args.scheduler and url is not None:
        raise UsageError("Give --scheduler or --gateway, not both.")
    if url is None:
        if getattr(args, "gateway_cluster", None) or getattr(args, "keep_cluster", False):
            raise UsageError("--gateway-cluster and --keep-cluster go with --gateway.")
        return connect_from_args(args) if args.scheduler else None
    return gateway_from_args(args, workers, login=login)


def gateway_from_args(args: argparse.Namespace, workers: int, *, login: Any = None) -> Any:
    """A client of a Dask Gateway cluster with ``workers`` workers, for --gateway (see :func:`remote_from_args`)."""
    from petmodel.cluster.connect import connect_cluster, shutdown
    from petmodel.cluster.scaling import scaler_of
    from petmodel.config import ScalingConfig

    scaling = ScalingConfig.from_env()
    scaling = ScalingConfig(max_workers=max(scaling.max_workers, workers), grace_s=scaling.grace_s,
                            join_timeout_s=scaling.join_timeout_s)
    gw = login or gateway_login(args)
    made = not args.gateway_cluster
    cluster = client = None
    try:
        if made:
            cluster = gw.create(shutdown_on_close=not args.keep_cluster)
            say(args, f"Created the gateway cluster {cluster.name}" + (" (kept running at the end)."
                                                                       if args.keep_cluster else "."))
        else:
            cluster = gw.attach(args.gateway_cluster, shutdown_on_close=False)
        client = connect_cluster(cluster, timeout=args.connect_timeout, own=True, scaling=scaling,
                                 floor=workers if made else None)
        scaler = scaler_of(client)
        if scaler is not None and workers:
            scaler.scale_to(workers, wait=True, on_scale=lambda text: say(args, text))
        return client
    except BaseException:
        if client is not None:
            shutdown(client)
        if made and cluster is not None and not args.keep_cluster:
            gw.stop(cluster.name, quiet=True)  # a cluster made for this command never outlives its failure
        raise
    finally:
        gw.close()


MODEL_HELP = ("which model: best (the default: the completed run with the lowest validation NLL, as the app's "
              "Generate page picks), latest (the newest completed run), a run id, a unique start of one (e.g. "
              "20261206-202251), a run's name, or a checkpoint file")


def add_model_option(p: argparse.ArgumentParser) -> None:
    """``--model`` of generate, score and evaluate: optional, so a user with one good run need not copy its id."""
    p.add_argument("--model", default="best", metavar="MODEL", help=MODEL_HELP)


def model_from_args(args: argparse.Namespace) -> Path:
    """The checkpoint file ``--model`` names (see :meth:`petmodel.store.RunStore.find_model`).

    When the run was picked for the user (best, latest, a start of its id, its name) a line on stderr says which,
    so the names printed can be traced to a run; an exact run id or a file needs no such line.
    """
    choice = open_store(args.store, existing=True).find_model(args.model)
    if choice.how not in ("id", "path"):
        say(args, choice.describe())
    return choice.path


def run_id_arg(text: str) -> str:
    """An argparse ``type=`` for a run id that must be given: an empty one is most often an unset shell
    variable (``--resume "$RUN"``), and quietly training a new run instead would hide that."""
    if not text.strip():
        raise argparse.ArgumentTypeError("a run id is needed, got an empty one (an unset shell variable?)")
    return text.strip()


def open_store(path: str | None, *, existing: bool = False) -> RunStore:
    """The run store at ``path`` (or the default one), with runs and studies of dead processes marked failed.

    ``existing``: the command only reads or edits runs (listing, comparing, generating), so a ``--store`` folder
    that holds no store is a mistyped path, said in one sentence, not a reason to create ``runs.sqlite`` and
    ``checkpoints/`` there (``runs --store /etc`` did).
    """
    from petmodel.store import RunStore, default_store_dir

    if existing and path and not (Path(path).expanduser() / "runs.sqlite").is_file():
        raise UsageError(f"There is no run store in {path} (no runs.sqlite there); give the folder a training run "
                         "wrote to, leave out --store for the default one, or train there first with "
                         "`python -m petmodel train --store …`.")
    store = RunStore(path or default_store_dir())
    store.reconcile_orphans()
    return store


def say(args: argparse.Namespace, text: str) -> None:
    """A progress line on stderr, unless the output is JSON for a script."""
    if not args.json:
        print(text, file=sys.stderr)

"""``python -m petmodel``: train, generate, evaluate, runs (and the studies' sweep and search).

Expected failures print one sentence to stderr and exit 1 (2 for bad usage) with no
traceback; ``--json`` prints one JSON object as the last line of stdout for scripts.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from petmodel.errors import PetmodelError, UsageError


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be ≥ 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0 or value != value or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def _add_store(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", metavar="DIR", help="run store folder (default: $PETMODEL_STORE or the user data folder)")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")


def _add_run_options(p: argparse.ArgumentParser) -> None:
    """Options shared by train, sweep and search."""
    p.add_argument("--data", metavar="PATH", help="CSV with an \"Animal's Name\"/name column or a text file "
                   "of names (default: the official Seattle export, downloaded once and cached)")
    p.add_argument("--epochs", type=_positive_int, help="stop after N epochs")
    p.add_argument("--max-seconds", type=_positive_float, metavar="S", help="stop after S seconds of training")
    p.add_argument("--embed", type=_positive_int, default=32, help="embedding size (default 32)")
    p.add_argument("--hidden", type=_positive_int, default=256, help="LSTM hidden size (default 256)")
    p.add_argument("--layers", type=_positive_int, default=1, help="LSTM layers (default 1)")
    p.add_argument("--dropout", type=float, default=0.3, help="dropout in [0, 1) (default 0.3)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="bf16 autocast or fp32")
    p.add_argument("--scheduler", metavar="ADDRESS", help="Dask scheduler address or scheduler file "
                   "(default: an embedded local cluster)")
    p.add_argument("--threads-per-worker", type=_positive_int, default=1,
                   help="torch threads per worker of the embedded local cluster (default 1)")
    p.add_argument("--wandb", choices=["disabled", "offline", "online"], default="disabled",
                   help="Weights & Biases tracking (default disabled)")
    p.add_argument("--wandb-project", default="petnames", metavar="NAME", help="W&B project (default petnames)")
    _add_store(p)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m petmodel",
                                     description="Train a character-level LSTM that invents pet names, "
                                                 "on this machine or on a Dask cluster with DDP.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    t = sub.add_parser("train", help="train a model", description="Train a model and record it in the run store. "
                       "Without --workers it trains in this process; with --workers N it runs DDP on N Dask workers.")
    _add_run_options(t)
    t.add_argument("--batch-size", type=_positive_int, default=128, help="batch per worker (default 128)")
    t.add_argument("--lr", type=_positive_float, default=0.005, help="Adam learning rate (default 0.005)")
    t.add_argument("--workers", type=_positive_int, help="train with DDP on N Dask workers")
    t.add_argument("--name", help="a label for the run")
    t.add_argument("--quiet", action="store_true", help="no progress bar")

    g = sub.add_parser("generate", help="invent names with a trained model")
    g.add_argument("--model", required=True, metavar="RUN_ID_OR_PATH", help="run id in the store or a checkpoint file")
    g.add_argument("-n", type=int, default=20, help="how many names (default 20)")
    g.add_argument("--temperature", type=float, default=1.0, help="sampling temperature, 0 < T ≤ 3 (default 1)")
    g.add_argument("--prefix", default="", help="every name starts with this")
    g.add_argument("--top-k", type=int, help="sample only from the k likeliest characters")
    g.add_argument("--max-len", type=int, default=24, help="longest name (default 24)")
    g.add_argument("--seed", type=int, help="same seed, same names")
    g.add_argument("--new-only", action="store_true", help="only names absent from the training data")
    g.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="bf16 autocast (faster on CPUs with AMX)")
    _add_store(g)

    e = sub.add_parser("evaluate", help="validation NLL of a model")
    e.add_argument("--model", required=True, metavar="RUN_ID_OR_PATH")
    e.add_argument("--data", metavar="PATH", help="names to evaluate on (default: the data the model was trained on)")
    _add_store(e)

    r = sub.add_parser("runs", help="list the run store")
    r.add_argument("--limit", type=_positive_int, default=50)
    r.add_argument("--study", help="only runs of this study")
    _add_store(r)

    from petmodel.experiments_cli import add_study_commands

    add_study_commands(sub, _add_run_options)
    return parser


def open_store(path: str | None):
    from petmodel.store import RunStore, default_store_dir

    store = RunStore(path or default_store_dir())
    store.reconcile_orphans()
    return store


def spec_from_args(args: argparse.Namespace, **overrides: Any):
    from petmodel.config import RunSpec
    from petmodel.config import TrainConfig

    max_seconds = args.max_seconds
    if args.epochs is None and max_seconds is None:
        max_seconds = 60.0
    train = TrainConfig(epochs=args.epochs, max_seconds=max_seconds,
                        batch_size=overrides.pop("batch_size", getattr(args, "batch_size", 128)),
                        lr=overrides.pop("lr", getattr(args, "lr", 0.005)), seed=args.seed,
                        precision=args.precision)
    return RunSpec(train=train, embed=args.embed, hidden=args.hidden, layers=args.layers, dropout=args.dropout,
                   data=args.data, workers=overrides.pop("workers", getattr(args, "workers", None) or 0),
                   name=getattr(args, "name", None), wandb_mode=args.wandb, wandb_project=args.wandb_project,
                   **overrides)


class ProgressBar:
    """tqdm bar over the time budget (or the epochs) fed by metric rows."""

    def __init__(self, spec, enabled: bool) -> None:
        self.bar = None
        if enabled:
            from tqdm import tqdm

            by_time = spec.train.max_seconds is not None
            total = spec.train.max_seconds if by_time else spec.train.epochs
            self.by_time = by_time
            self.bar = tqdm(total=total, unit="s" if by_time else "epoch", file=sys.stderr, mininterval=0.5,
                            bar_format="{l_bar}{bar}| {n:.1f}/{total:.0f} {unit} [{elapsed}<{remaining}{postfix}]")

    def __call__(self, row: dict[str, Any]) -> None:
        if self.bar is None or row.get("rank", 0) != 0:
            return
        pos = row["elapsed"] if self.by_time else row["epoch"]
        self.bar.n = min(pos, self.bar.total)
        post = {}
        if row.get("loss") is not None:
            post["loss"] = f"{row['loss']:.3f}"
            post["samples/s"] = f"{row['samples_per_s']:.0f}"
        if row.get("val_nll") is not None:
            post["val"] = f"{row['val_nll']:.3f}"
        self.bar.set_postfix(post, refresh=False)
        self.bar.update(0)  # redraws at most every mininterval

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def cmd_train(args: argparse.Namespace) -> dict[str, Any]:
    """Validate everything cheap first (spec, W&B, cluster), then load data, then train."""
    spec = spec_from_args(args)
    store = open_store(args.store)
    from petmodel.data import load_corpus
    from petmodel.tracking import check_tracking

    check_tracking(spec)
    client = None
    if spec.workers:
        from petmodel.dist.cluster import connect, start_local_cluster

        client = (connect(args.scheduler) if args.scheduler
                  else start_local_cluster(spec.workers, args.threads_per_worker))
    try:
        corpus = load_corpus(spec.data, progress=not args.quiet)
        if not args.json and not args.quiet:
            print(f"Data: {corpus.summary()}.", file=sys.stderr)
        bar = ProgressBar(spec, enabled=not args.quiet)
        try:
            if client is not None:
                from petmodel.dist.launch import launch_run

                handle = launch_run(client, spec, store, corpus=corpus, on_metrics=bar)
                try:
                    return handle.wait()
                except KeyboardInterrupt:
                    handle.cancel()
                    handle.wait(timeout=30)
                    raise
            from petmodel.runner import train_in_process

            return train_in_process(spec, store, corpus=corpus, on_metrics=bar)
        finally:
            bar.close()
    finally:
        if client is not None:
            from petmodel.dist.cluster import shutdown

            shutdown(client)


def cmd_generate(args: argparse.Namespace) -> dict[str, Any]:
    from petmodel.checkpoint import load_checkpoint
    from petmodel.generate import GenerateConfig, generate

    config = GenerateConfig(n=args.n, temperature=args.temperature, top_k=args.top_k, prefix=args.prefix,
                            max_len=args.max_len, seed=args.seed, new_only=args.new_only,
                            precision=args.precision)
    path = open_store(args.store).resolve_model(args.model)
    out = generate(load_checkpoint(path), config)
    if not args.json:
        print("\n".join(out.names))
    return {"names": out.names, "seed": out.seed, "model": str(path)}


def cmd_evaluate(args: argparse.Namespace) -> dict[str, Any]:
    from petmodel.checkpoint import load_checkpoint
    from petmodel.data import encode_names, load_corpus
    from petmodel.train import evaluate_nll

    path = open_store(args.store).resolve_model(args.model)
    ckpt = load_checkpoint(path)
    source = args.data or ckpt.meta.get("data_source")
    corpus = load_corpus(source, alphabet=ckpt.alphabet)
    val = evaluate_nll(ckpt.build_model(), encode_names(corpus.val_names, ckpt.alphabet))
    if not args.json:
        print(f"Validation NLL {val:.4f} nats/char over {len(corpus.val_names):,} names of {corpus.source}.")
    return {"val_nll": round(val, 4), "val_names": len(corpus.val_names), "data": corpus.source, "model": str(path)}


def cmd_runs(args: argparse.Namespace) -> dict[str, Any]:
    store = open_store(args.store)
    runs = store.list_runs(study_id=args.study, limit=args.limit)
    rows = [{"run_id": r.id, "name": r.name, "status": r.status, "kind": r.kind, "study_id": r.study_id,
             "created": r.created, "workers": len(r.workers), "backend": r.backend,
             "val_nll": r.best_val_nll if r.best_val_nll is not None else r.val_nll,
             "train_seconds": r.train_seconds, "error": r.error, "model_path": r.model_path} for r in runs]
    if not args.json:
        if not rows:
            print(f"No runs yet in {store.root}.")
        for row in rows:
            val = f"{row['val_nll']:.3f}" if row["val_nll"] is not None else "  -  "
            print(f"{row['run_id']}  {row['status']:<9}  workers {row['workers']:<2}  val {val}  "
                  f"{row['name'] or ''}{'  ' + row['error'] if row['error'] else ''}")
    return {"store": str(store.root), "runs": rows}


COMMANDS = {"train": cmd_train, "generate": cmd_generate, "evaluate": cmd_evaluate, "runs": cmd_runs}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from petmodel.experiments_cli import STUDY_COMMANDS

    command = {**COMMANDS, **STUDY_COMMANDS}[args.command]
    try:
        result = command(args)
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except PetmodelError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted; the run is marked cancelled in the store.", file=sys.stderr)
        return 130
    if args.json:
        print(json.dumps(result, default=str))
    elif args.command == "train":
        print(f"Run {result['run_id']} {result['status']}: validation NLL {result.get('val_nll')} "
              f"after {result.get('train_seconds')} s; model at {result.get('model_path')}.")
    return 0

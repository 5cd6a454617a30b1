"""``train``, ``generate``, ``score``, ``evaluate`` and ``runs``: one run at a time, and the run store."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from petmodel.cli.args import (
    add_model_option,
    add_run_options,
    add_store_options,
    gateway_login,
    model_from_args,
    non_negative_float,
    non_negative_int,
    open_store,
    positive_float,
    positive_int,
    remote_from_args,
    run_id_arg,
    spec_from_args,
)
from petmodel.cli.json_rows import json_line, run_row, train_row
from petmodel.cli.signals import Interrupted, StopOnSignals
from petmodel.config import (
    DEFAULT_SPEC,
    MAX_RUN_NOTE_CHARS,
    PRECISIONS,
    SPECIES,
    TEMPERATURE_RANGE,
    GenerateConfig,
    RunSpec,
    check_label,
    counted,
    quoted,
)
from petmodel.errors import UsageError
from petmodel.names import display_name, display_names
from petmodel.run_names import matches
from petmodel.status import RunStatus

NOTE_CHARS = 40  # characters of a note the `runs` table shows; `runs --json` has all of it

if TYPE_CHECKING:
    from distributed import Client

    from petmodel.resume import Resume

    from petmodel.data import NameCorpus
    from petmodel.store import RunStore


def add_run_commands(sub: Any) -> None:
    """Add the ``train``, ``generate``, ``evaluate`` and ``runs`` subcommands to the CLI's subparsers."""
    t = sub.add_parser("train", help="train a model", description="Train a model and record it in the run store. "
                       "Without --workers it trains in this process; with --workers N it runs DDP on N Dask workers.")
    add_run_options(t, default_seconds=DEFAULT_SPEC.train.max_seconds)
    t.add_argument("--batch-size", type=positive_int, default=DEFAULT_SPEC.train.batch_size,
                   help="batch per worker (default %(default)s)")
    t.add_argument("--lr", type=positive_float, default=DEFAULT_SPEC.train.lr,
                   help="Adam learning rate (default %(default)s)")
    t.add_argument("--workers", type=positive_int, help="train with DDP on N Dask workers")
    t.add_argument("--no-wait", action="store_true", help="with --workers: fail at once, naming them, when the "
                   "workers are busy with other runs (default: wait in the cluster's queue)")
    t.add_argument("--name", help="a name for the run (default: made from its settings, e.g. 2w-b256-lr0.005; "
                   "-2, -3, … is added when another run has it)")
    t.add_argument("--note", metavar="TEXT", help="a line on what the run is for (`runs note` changes it later)")
    t.add_argument("--quiet", action="store_true", help="no progress bar")
    t.add_argument("--no-species", action="store_true",
                   help="ignore the data's species column (train the unconditioned model)")
    t.add_argument("--checkpoint-every", type=non_negative_float, metavar="S",
                   help=f"save a snapshot of the training state every S seconds, 0: only when the run stops "
                        f"(default {DEFAULT_SPEC.train.checkpoint_every_s:g})")
    t.add_argument("--max-restarts", type=non_negative_int, metavar="N",
                   help=f"with --workers: re-form the run on the remaining workers up to N times when a worker is "
                        f"lost (default {DEFAULT_SPEC.max_restarts})")
    t.add_argument("--resume", metavar="RUN_ID", type=run_id_arg,
                   help="continue RUN_ID (failed, cancelled or finished) from its latest snapshot as a new run, with "
                        "its settings; --max-seconds, --epochs, --workers, --checkpoint-every and --max-restarts "
                        "override them")
    t.set_defaults(handler=cmd_train)

    gd = GenerateConfig()  # the defaults live in the config; flags left out are not passed
    g = sub.add_parser("generate", help="invent names with a trained model",
                       description="Invent names with a trained model, one character at a time: the same model, "
                                   "temperature, prefix and seed always give the same names.")
    add_model_option(g)
    g.add_argument("-n", type=int, help=f"how many names (default {gd.n})")
    g.add_argument("--temperature", type=float, help=f"sampling temperature, {TEMPERATURE_RANGE[0]:g} ≤ T ≤ "
                                                      f"{TEMPERATURE_RANGE[1]:g}, as the app's (default {gd.temperature:g})")
    g.add_argument("--prefix", help="every name starts with this")
    g.add_argument("--top-k", type=int, help="sample only from the k likeliest characters")
    g.add_argument("--max-len", type=int, help=f"longest name (default {gd.max_len})")
    g.add_argument("--seed", type=int, help="same seed, same names")
    g.add_argument("--species", choices=SPECIES, help=f"names for this species (default {gd.species})")
    g.add_argument("--new-only", action="store_true", default=None, help="only names absent from the training data")
    g.add_argument("--precision", choices=PRECISIONS, help=f"bf16 autocast (faster on CPUs with AMX; default "
                   f"{gd.precision})")
    add_store_options(g)
    g.set_defaults(handler=cmd_generate)

    s = sub.add_parser("score", help="how pet-like is a name?", description="Per name: the NLL per character "
                       "(lower is more pet-like), the share of real held-out names it beats, each character's "
                       "surprise in nats.")
    s.add_argument("names", nargs="+", metavar="NAME")
    add_model_option(s)
    s.add_argument("--species", choices=SPECIES, default="any", help="score as a name for this species "
                   "(default %(default)s)")
    add_store_options(s)
    s.set_defaults(handler=cmd_score)

    e = sub.add_parser("evaluate", help="validation NLL of a model",
                       description="Score a trained model on the validation names of its data: the NLL per "
                                   "character it gives them (lower is better).")
    add_model_option(e)
    e.add_argument("--data", metavar="PATH", help="names to evaluate on (default: the data the model was trained on)")
    add_store_options(e)
    e.set_defaults(handler=cmd_evaluate)

    r = sub.add_parser("runs", help="list the run store")
    r.add_argument("--limit", type=positive_int, default=50, help="at most this many runs (default %(default)s)")
    r.add_argument("--study", help="only runs of this study")
    r.add_argument("--search", metavar="TEXT", help="only runs whose id, name or note holds TEXT (case aside)")
    add_store_options(r)
    r.set_defaults(handler=cmd_runs)
    runs_sub = add_runs_delete(r)
    add_runs_note(runs_sub)
    add_runs_kill_worker(runs_sub)
    from petmodel.cli.compare_command import add_runs_compare

    add_runs_compare(runs_sub)


def add_runs_delete(runs: argparse.ArgumentParser) -> Any:
    """``runs delete RUN_ID…``: a subcommand of ``runs``, which alone still lists the store.

    Its ``--store`` and ``--json`` default to SUPPRESS, so given before ``delete`` (``runs --store X
    delete ID``) they are not overwritten by the subcommand's own defaults.
    """
    sub = runs.add_subparsers(dest="runs_command", metavar="SUBCOMMAND")
    d = sub.add_parser("delete", help="delete finished runs with their checkpoints and snapshots",
                       description="Delete finished runs from the store: their rows, metrics, checkpoints and "
                                   "snapshots. A queued or running run is deleted only with --force; any unknown or "
                                   "refused id deletes nothing.")
    d.add_argument("run_ids", nargs="+", metavar="RUN_ID")
    d.add_argument("--force", action="store_true",
                   help="delete runs still recorded queued or running too, e.g. ones whose driver died on another "
                        "host (a restarted container); never one that a live process on this host drives")
    add_store_options(d, subcommand=True)
    d.set_defaults(handler=cmd_runs_delete)
    return sub


def add_runs_note(sub: Any) -> None:
    """``runs note RUN_ID TEXT``: set (or, with "", clear) a run's note. Flags default to SUPPRESS, as ``delete``'s."""
    n = sub.add_parser("note", help="set or clear a run's note", description="Set the note of a run, the line on "
                       "what it is for that `runs` shows and `runs --search` finds; \"\" clears it.")
    n.add_argument("run_id", metavar="RUN_ID")
    n.add_argument("text", metavar="TEXT")
    add_store_options(n, subcommand=True)
    n.set_defaults(handler=cmd_runs_note)


def add_runs_kill_worker(sub: Any) -> None:
    """``runs kill-worker RUN_ID --rank R``: end that rank's worker process, as a crash would (see
    :mod:`petmodel.cluster.worker_kill`), to watch the run re-form. Flags default to SUPPRESS, as ``delete``'s."""
    k = sub.add_parser("kill-worker", help="end the worker process of one rank of a running run, to watch it recover",
                       description="End the Dask worker process that holds one rank of a running multi-worker run, "
                                   "with no clean-up, as a crash would. The run then re-forms on the remaining "
                                   "workers (plus free ones) from its newest snapshot, if it has restarts left "
                                   "(train --max-restarts), else it fails naming the worker.")
    k.add_argument("run_id", metavar="RUN_ID")
    k.add_argument("--rank", type=non_negative_int, required=True, metavar="R", help="the rank whose worker ends")
    k.add_argument("--scheduler", metavar="ADDRESS", default=argparse.SUPPRESS,
                   help="the scheduler of the cluster the run trains on (default: asked of the rank's worker, "
                        "which works for tcp:// workers)")
    k.add_argument("--connect-timeout", type=positive_float, default=argparse.SUPPRESS, metavar="S",
                   help="give up on --scheduler after S seconds at each step of connecting (default 10)")
    for flag, what in (("--tls-ca-file", "CA certificate"), ("--tls-cert", "this client's TLS certificate"),
                       ("--tls-key", "this client's TLS private key")):
        k.add_argument(flag, metavar="PATH", default=argparse.SUPPRESS, help=f"{what} for a tls:// scheduler")
    add_store_options(k, subcommand=True)
    k.set_defaults(handler=cmd_runs_kill_worker)


class ProgressBar:
    """tqdm bar over the time budget (or the epochs) fed by metric rows.

    Once the budget is spent the loop still validates the final weights, which takes seconds with no
    metric row in between; the bar then says "validating…" so a full bar that stands still does not
    look like a hang, and drops the word when that validation's row arrives.
    """

    FINAL_VALIDATION = "validating…"

    def __init__(self, spec: RunSpec, enabled: bool) -> None:
        self.bar = None
        self.finishing = False  # the budget is spent: the next validation row is the final one
        if enabled:
            from tqdm import tqdm

            by_time = spec.train.max_seconds is not None
            total = spec.train.max_seconds if by_time else spec.train.epochs
            self.by_time, self.epochs = by_time, spec.train.epochs
            self.bar = tqdm(total=total, unit="s" if by_time else "epoch", file=sys.stderr, mininterval=0.5,
                            bar_format="{l_bar}{bar}| {n:.1f}/{total:.0f} {unit} [{elapsed}<{remaining}{postfix}]")

    def __call__(self, row: dict[str, Any]) -> None:
        if self.bar is None or row.get("rank", 0) != 0:
            return
        pos = row["elapsed"] if self.by_time else row["epoch"]
        self.bar.n = min(pos, self.bar.total)
        redraw = self._mark_final_validation(row, pos)
        post = {}
        if row.get("loss") is not None:
            post["loss"] = f"{row['loss']:.3f}"
            post["samples/s"] = f"{row['samples_per_s']:.0f}"
        if row.get("val_nll") is not None:
            post["val"] = f"{row['val_nll']:.3f}"
        self.bar.set_postfix(post, refresh=False)
        if redraw:
            self.bar.refresh()  # now: no row comes for the seconds the final validation takes
        else:
            self.bar.update(0)  # redraws at most every mininterval

    def _mark_final_validation(self, row: dict[str, Any], pos: float) -> bool:
        """Say "validating…" from the step that spends the budget until the final validation's row;
        whether the bar must be redrawn at once."""
        assert self.bar is not None
        if row.get("kind") == "val" and self.finishing:
            self.finishing = False
            self.bar.set_description_str("", refresh=False)
            return True
        spent = pos >= self.bar.total or (self.epochs is not None and row.get("epoch", 0) >= self.epochs)
        if row.get("kind") != "val" and not self.finishing and spent:
            self.finishing = True
            self.bar.set_description_str(self.FINAL_VALIDATION, refresh=False)
            return True
        return False

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def cmd_train(args: argparse.Namespace) -> dict[str, Any]:
    """Validate everything cheap first (spec, W&B, cluster), then load data, then train.

    The first Ctrl-C (or SIGTERM) stops the run at the next step and saves its snapshot; a second
    one quits at once.
    """
    store = open_store(args.store)
    resume = None
    if args.resume:
        from petmodel.resume import prepare_resume

        spec, resume = prepare_resume(store, args.resume, max_seconds=args.max_seconds, epochs=args.epochs,
                                      workers=args.workers, checkpoint_every_s=args.checkpoint_every,
                                      max_restarts=args.max_restarts, name=args.name, note=args.note)
    else:
        spec = spec_from_args(args, batch_size=args.batch_size, lr=args.lr, workers=args.workers or 0,
                              name=args.name, note=args.note, species=not args.no_species)
        spec = spec.with_(**{k: v for k, v in (("checkpoint_every_s", args.checkpoint_every),
                                                ("max_restarts", args.max_restarts)) if v is not None})
    if args.gateway is not None and not spec.workers:
        raise UsageError("--gateway trains on a gateway cluster: give --workers N.")
    login = gateway_login(args) if args.gateway is not None else None  # a wrong password: before torch loads
    from petmodel.data import load_corpus
    from petmodel.sources import describe_source
    from petmodel.tracking import check_tracking

    check_tracking(spec)
    if not spec.workers:  # in this process: this CPU must run the precision (workers answer at launch)
        from petmodel.precision import check_precision, local_device

        check_precision(spec.train.precision, local_device())
    corpus = load_corpus(spec.data)  # before any cluster starts: bad data fails in a second
    client = None
    if spec.workers:
        from petmodel.cluster.local import oversubscription_note, start_local_cluster

        if args.scheduler or args.gateway is not None:
            client = remote_from_args(args, spec.workers, login=login)  # a gateway cluster made here goes at the end
        else:
            client = start_local_cluster(spec.workers, args.threads_per_worker)  # refuses past the machine's cap
            if note := oversubscription_note(spec.workers, args.threads_per_worker):
                print(f"note: {note}", file=sys.stderr)  # before training starts on shared cores
    try:
        if not args.json and not args.quiet:
            print(f"Data: {describe_source(corpus.source)}: {corpus.summary()}.", file=sys.stderr)
        threads = None
        if client is None:  # in this process: the cores free now, as a busy core's thread holds back every step
            from petmodel.threads import use_free_cores

            threads = use_free_cores()
            if (note := threads.note()) and not args.quiet:
                print(f"note: {note}", file=sys.stderr)
        bar = ProgressBar(spec, enabled=not args.quiet)
        try:
            with StopOnSignals(quiet=args.quiet or args.json) as stop:
                result = _train(client, spec, store, corpus, bar, wait=not args.no_wait, quiet=args.quiet,
                                stop=stop, resume=resume)
        finally:
            bar.close()
        if threads is not None:
            result = {**result, "torch_threads": threads.threads}
    finally:
        if client is not None:
            from petmodel.cluster.connect import shutdown

            shutdown(client)
    result = train_row(store, result["run_id"], result)  # the run as `runs` shows it, plus how training ended
    if result["status"] == RunStatus.CANCELLED:
        if args.json:
            print(json_line(result))
        raise Interrupted(f"run {result['run_id']} stopped and its snapshot is saved; continue it with "
                          f"`python -m petmodel train --resume {result['run_id']}`.")
    if not args.json:
        print(f"Run {result['run_id']} {result['status']}: validation NLL {result.get('val_nll')} "
              f"after {result.get('train_seconds')} s; model at {result.get('model_path')}.")
    return result


def _train(client: Client | None, spec: RunSpec, store: RunStore, corpus: NameCorpus,
           bar: ProgressBar, *, wait: bool = True, quiet: bool = False, stop: StopOnSignals,
           resume: Resume | None = None) -> dict[str, Any]:
    """Train on the cluster or, without a client, in this process; ``stop`` ends it cleanly.

    On a cluster, busy workers make the launch wait in the scheduler's queue (``wait``), saying its place.
    """
    if client is not None:
        from petmodel.cluster.launch import launch_run

        def queued(position: int, busy: list[str]) -> None:
            if not quiet:
                print(f"Waiting for free workers: number {position} in the queue (busy: {', '.join(busy)}).",
                      file=sys.stderr)

        handle = launch_run(client, spec, store, corpus=corpus, on_metrics=bar, wait=wait, on_queue=queued,
                            cancel=stop.event, resume=resume)
        stop.on_stop = handle.cancel
        if stop.event.is_set():
            handle.cancel()
        try:
            return handle.wait()
        except KeyboardInterrupt:  # the second Ctrl-C: record the end, without waiting for the ranks
            handle.cancel()
            handle.wait(timeout=30)
            raise
    from petmodel.runner import train_in_process

    return train_in_process(spec, store, corpus=corpus, on_metrics=bar, should_stop=stop.event.is_set,
                            resume=resume)


def cmd_generate(args: argparse.Namespace) -> dict[str, Any]:
    from petmodel.checkpoint import load_checkpoint
    from petmodel.generate import generate

    given = {"n": args.n, "temperature": args.temperature, "top_k": args.top_k, "prefix": args.prefix,
             "max_len": args.max_len, "seed": args.seed, "new_only": args.new_only, "precision": args.precision,
             "species": args.species}
    config = GenerateConfig(**{k: v for k, v in given.items() if v is not None})
    path = model_from_args(args)
    out = generate(load_checkpoint(path), config)
    if not args.json:
        print("\n".join(display_names(out.names)))  # as the Generate page shows them; the JSON keeps the model's
    return {"names": out.names, "seed": out.seed, "species": config.species, "model": str(path)}


def cmd_score(args: argparse.Namespace) -> dict[str, Any]:
    """Score names; the reference is the validation split of the data the model was trained on."""
    from petmodel.checkpoint import load_checkpoint
    from petmodel.data import load_corpus
    from petmodel.score import Scorer

    path = model_from_args(args)
    ckpt = load_checkpoint(path)
    ckpt.species_id(args.species)  # an unconditioned model refuses a species before the data is read
    corpus = load_corpus(ckpt.meta.get("data_source"), alphabet=ckpt.alphabet)
    scores = Scorer(ckpt, corpus).score(args.names, args.species)
    rows = [s.to_dict() for s in scores]
    if not args.json:
        for s, row in zip(scores, rows):
            shown = display_name(s.name)  # as the app and `generate` show it; the JSON keeps the model's spelling
            chars = " ".join(f"{c}:{v:.1f}" for c, v in zip(shown, s.surprise))
            print(f"{shown}: NLL {s.nll:.3f} nats/char, {percentile_text(row['percentile'], args.species)}; "
                  f"surprise {chars} end:{s.end_surprise:.1f}")
    return {"scores": rows, "species": args.species, "model": str(path)}


def percentile_text(percentile: float | None, species: str) -> str:
    """``score``'s percentile in words, to the JSON's one decimal (99.8 there is 99.8% here, never 100%)."""
    kind = "" if species == "any" else f"{species} "
    if percentile is None:
        return f"no real {kind}names to compare it with"
    return f"more pet-like than {percentile:.1f}% of real {kind}names"


def cmd_evaluate(args: argparse.Namespace) -> dict[str, Any]:
    from petmodel.checkpoint import load_checkpoint
    from petmodel.data import encode_names, load_corpus
    from petmodel.nll import evaluate_nll

    path = model_from_args(args)
    ckpt = load_checkpoint(path)
    source = args.data or ckpt.meta.get("data_source")
    corpus = load_corpus(source, alphabet=ckpt.alphabet)
    # As in training: each validation name under its most common species ("any" for data without species).
    val = evaluate_nll(ckpt.build_model(), encode_names(corpus.val_names, ckpt.alphabet, corpus.val_species or None))
    if not args.json:
        print(f"Validation NLL {val:.4f} nats/char over {len(corpus.val_names):,} names of {corpus.source}.")
    return {"val_nll": round(val, 4), "val_names": len(corpus.val_names), "data": corpus.source, "model": str(path)}


def runs_listing(rows: list[dict[str, Any]]) -> str:
    """The ``runs`` table: a header, one aligned line per run, "-" for what a run lacks.

    ``rows`` are :func:`~petmodel.cli.json_rows.run_row` rows; WHERE reads as on the pages
    ("in-process", "2 workers"), VAL NLL is also that of a run that failed or was cancelled.
    """
    columns = [("run_id", "RUN"), ("status", "STATUS"), ("where", "WHERE"), ("val_nll", "VAL NLL"),
               ("train_seconds", "TRAIN S"), ("name", "NAME"), ("note", "NOTE"), ("error", "ERROR")]

    def cell(key: str, value: Any) -> str:
        if value is None or value == "":
            return "-"
        if key == "val_nll":
            return f"{value:.3f}"
        if key == "train_seconds":
            return f"{value:.0f}"
        line = " ".join(str(value).split())  # one line per run, whatever a name holds
        return line if key != "note" or len(line) <= NOTE_CHARS else line[:NOTE_CHARS - 1].rstrip() + "…"

    def where(row: dict[str, Any]) -> str:
        n = row["workers"]
        return "in-process" if row["where"] == "in-process" else counted(n, "worker")

    table = [[title for _, title in columns]] + [
        [where(row) if k == "where" else cell(k, row.get(k)) for k, _ in columns] for row in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(columns) - 1)]
    return "\n".join("  ".join([*(c.ljust(w) for c, w in zip(line, widths)), line[-1]]).rstrip() for line in table)


def cmd_runs(args: argparse.Namespace) -> dict[str, Any]:
    """The newest ``--limit`` runs (of ``--study``) whose id, name or note holds ``--search``."""
    store = open_store(args.store, existing=True)
    if args.search:
        found = [r for r in store.list_runs(study_id=args.study) if matches(args.search, r.id, r.name, r.note)]
        runs = found[:args.limit]
    else:
        runs = store.list_runs(study_id=args.study, limit=args.limit)
    rows = [run_row(store, r) for r in runs]
    if not args.json:
        none = f"No run matches {quoted(args.search)} in" if args.search else "No runs yet in"
        print(runs_listing(rows) if rows else f"{none} {store.root}.")
    return {"store": str(store.root), "runs": rows}


def cmd_runs_note(args: argparse.Namespace) -> dict[str, Any]:
    """Set the run's note in the store (its config keeps the one given at launch); "" clears it."""
    check_label("The note", args.text, limit=MAX_RUN_NOTE_CHARS)
    store = open_store(getattr(args, "store", None), existing=True)
    store.update_run(args.run_id, note=args.text.strip() or None)  # an unknown id: one sentence, exit 1
    run = store.get_run(args.run_id)
    name, note = (run.name, run.note) if run is not None else (None, None)
    if not getattr(args, "json", False):
        print(f"Run {args.run_id} now has the note {quoted(note, 80)}." if note else f"Run {args.run_id} has no note.")
    return {"store": str(store.root), "run_id": args.run_id, "name": name, "note": note}


def cmd_runs_delete(args: argparse.Namespace) -> dict[str, Any]:
    """Delete the named runs (all or none: an unknown or refused id is one sentence, exit 1)."""
    store = open_store(args.store, existing=True)
    deleted = store.delete_runs(args.run_ids, force=args.force)
    if not args.json:
        print(f"Deleted {len(deleted)} run{'s' if len(deleted) != 1 else ''}: {', '.join(deleted)}.")
    return {"store": str(store.root), "deleted": deleted}


def cmd_runs_kill_worker(args: argparse.Namespace) -> dict[str, Any]:
    """End the worker of ``--rank`` of a running run; its address and process id."""
    from petmodel.cluster.connect import connect, shutdown
    from petmodel.cluster.security import security_from
    from petmodel.cluster.worker_kill import kill_rank, rank_worker, scheduler_of

    store = open_store(getattr(args, "store", None), existing=True)
    worker = rank_worker(store, args.run_id, args.rank)  # refuses a run with no such worker before connecting
    security = security_from(*(getattr(args, n, None) for n in ("tls_ca_file", "tls_cert", "tls_key")))
    scheduler = getattr(args, "scheduler", None) or scheduler_of(worker)
    # ship=False: the cluster already runs the run's code; shipping ours now would touch training workers
    client = connect(scheduler, timeout=getattr(args, "connect_timeout", 10.0), security=security, ship=False)
    try:
        killed = kill_rank(client, store, args.run_id, args.rank)
    finally:
        shutdown(client)
    if not getattr(args, "json", False):
        print(killed.sentence())
    return {"run_id": killed.run_id, "rank": killed.rank, "worker": killed.worker, "pid": killed.pid}

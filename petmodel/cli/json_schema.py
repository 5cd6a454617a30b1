"""The shape of every ``--json`` result, written once: what ``docs/JSON.md`` shows and the tests hold the CLI to.

Scripts read these objects, so their fields are a contract. Each command's fields are declared
here (name, type, meaning, units); :func:`problems` checks a result against them (every
documented field present with its type, nothing undocumented), and :func:`render_markdown` writes
the tables of ``docs/JSON.md``, which ``tests/test_json_contract.py`` compares with this file. So
the code, the document and the test cannot drift apart.

Adding a field: declare it in the command's tuple below (``optional=True`` while some code path
does not produce it yet), produce it, then ``python -m petmodel.cli.json_schema --write docs/JSON.md``.

Types: ``string``, ``integer``, ``number`` (an integer or a float; never NaN or infinite: the CLI
prints those as null), ``boolean``, ``object`` (with the fields listed under it), ``array of T``,
``map of T`` (any keys, values of type T), ``any`` (a field reserved for a change still to land).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from petmodel.cli.json_fields import Command, Field
from petmodel.cli.json_study_schema import (
    COMPARE_ROW,
    FORECAST_ROW,
    GRID_NOTE,
    PARAMS,
    PLAN_ROW,
    SWEEP_ROW,
    SWEEP_SUMMARY,
    TRIAL,
)
from petmodel.status import RunStatus

__all__ = ["COMMANDS", "Command", "Field", "problems", "render_markdown", "write_markdown"]


_STATUSES = ", ".join(f'"{s.value}"' for s in RunStatus)

LOST_WORKER = (
    Field("worker", "string", "address of the Dask worker that was lost"),
    Field("rank", "integer", "the DDP rank it held"),
    Field("step", "integer", "the snapshot step the run re-formed from"),
    Field("failed_step", "integer", "the last step whose metrics had arrived when it was lost"),
    Field("at", "number", "when it was noticed, Unix seconds"),
    Field("why", "string", "one sentence saying what happened to it"),
)

STEP_TIME = (
    Field("step_s", "number", "wall time per step, validation and snapshots left out"),
    Field("compute_s", "number", "forward + backward"),
    Field("allreduce_s", "number", "the gradient all-reduce compute did not hide (0 in-process)"),
    Field("idle_s", "number", "waiting for a slower rank to hand over its gradient (0 in-process)"),
    Field("data_s", "number", "preparing the rank's slice of the batch"),
    Field("optimizer_s", "number", "gradient clipping and the Adam step"),
    Field("report_s", "number", "handing the step's metric row over (the store, or the event stream)"),
    Field("agree_s", "number", "the ranks' stop agreement, per step (0 in-process)"),
    Field("windows", "integer", "the windows of 16 steps (one row per rank each) it comes from"),
)

# The fields of one run as the store records it: each row of `runs`, and the start of `train`.
RUN_FIELDS = (
    Field("run_id", "string", "the run's id in the store (what `--model` and `--resume` take)"),
    Field("name", "string", "its name: the one given with `--name` (or by its study), else made from its settings, "
          "e.g. `2w-b256-lr0.005` (2 workers, global batch 256, learning rate 0.005; `inproc-…` in-process), with "
          "`-2`, `-3`, … when another run had it; unique in the store, case aside, so `--model` takes it. Null "
          "only in a read-only store an older petmodel wrote", nullable=True),
    Field("note", "string", "what the run is for, as given with `train --note` or `runs note`", nullable=True),
    Field("status", "string", f"one of {_STATUSES}"),
    Field("kind", "string", '"train" (a `train` run), "sweep" or "search" (a study\'s run)'),
    Field("study_id", "string", "the sweep or search the run belongs to", nullable=True),
    Field("created", "number", "when the run was recorded, Unix seconds"),
    Field("started", "number", "when it started training, Unix seconds", nullable=True),
    Field("finished", "number", "when it ended, Unix seconds; null while it runs", nullable=True),
    Field("workers", "integer", "how many workers it trained with: the DDP ranks it was launched with, 1 for "
          "an in-process run. A run that lost a worker keeps its count (it keeps its global batch); "
          "`worker_addresses` and `lost_workers` say what happened"),
    Field("where", "string", '"in-process" (trained in the CLI\'s or app\'s own process) or "cluster" (DDP on '
          "Dask workers)"),
    Field("backend", "string", '"local" in-process; the DDP backend on a cluster ("gloo" or "nccl"); null '
          "before it starts", nullable=True),
    Field("worker_addresses", "array of string", "the Dask workers of its last group of ranks, by rank; empty "
          "in-process"),
    Field("hosts", "array of string", "the hosts it trained on"),
    Field("global_batch", "integer", "names per optimiser step, all ranks together", nullable=True),
    Field("val_nll", "number", "its best validation NLL, nats per predicted character; for a run that did not "
          "complete (failed, cancelled, pruned, running), the best of its validation points so far; null "
          "before its first validation", nullable=True),
    Field("train_seconds", "number", "seconds of training (a completed run)", nullable=True),
    Field("samples", "integer", "names trained on, all ranks together (a completed run)", nullable=True),
    Field("error", "string", "why it failed or stopped, one sentence", nullable=True),
    Field("failed_worker", "string", "the worker whose loss failed the run", nullable=True),
    Field("model_path", "string", "its checkpoint file (a completed run)", nullable=True),
    Field("resumed_from", "string", "the run it continues (`train --resume`)", nullable=True),
    Field("restarts", "integer", "times it re-formed on the remaining workers after losing one"),
    Field("lost_workers", "array of object", "one per worker lost, oldest first", fields=LOST_WORKER),
    Field("step_time", "object", "where a step's time went, seconds per step: the typical window of every rank "
          "(the mean of the middle half of the windows, ranked by step time, so the parts add up to `step_s`); "
          "null for a run that recorded no window (fewer than 17 steps)", nullable=True, fields=STEP_TIME),
)

TRAIN_EXTRA = (
    Field("final_val_nll", "number", "validation NLL at the end of training, nats per predicted character "
          "(`val_nll` is the best, kept as the model)", nullable=True),
    Field("steps", "integer", "optimiser steps taken", nullable=True),
    Field("stopped_by", "string", '"time", "epochs" or "steps": the limit that ended training', nullable=True),
    Field("samples_per_s", "number", "names trained on per second of training, all ranks together",
          nullable=True),
    Field("torch_threads", "integer", "compute threads it trained with in this process: the cores free at its "
          "start, or `$PETMODEL_THREADS`; null on a cluster", nullable=True),
    Field("data", "object", "what it trained on", nullable=True, fields=(
        Field("data_source", "string", "the data file (or the packaged snapshot)"),
        Field("rows", "integer", "rows read"),
        Field("kept", "integer", "names kept after cleaning"),
        Field("dropped", "integer", "rows dropped (no usable name)"),
        Field("train_names", "integer", "distinct names in the training split"),
        Field("val_names", "integer", "distinct names in the validation split"),
        Field("species", "map of integer", "training names per species; empty without a species column"),
    )),
)

SCORE = (
    Field("name", "string", "the name as scored: cleaned like training names"),
    Field("nll", "number", "NLL per predicted character, nats (lower is more pet-like)"),
    Field("percentile", "number", "% of real held-out names it beats; null without reference names",
          nullable=True),
    Field("surprise", "array of number", "nats, one per character of `name`"),
    Field("end_surprise", "number", "nats for the name ending where it does"),
    Field("species", "string", "the species it was scored as"),
)

COMMANDS = (
    Command("train", "The run as `runs` lists it, then what only the end of training knows. A cancelled run "
            "(Ctrl-C) prints it too, then exits 130.", RUN_FIELDS + TRAIN_EXTRA),
    Command("runs", "The run store's runs, newest first (with `--search TEXT`: those whose id, name or note holds "
            "it, case aside).", (
        Field("store", "string", "the run store's folder"),
        Field("runs", "array of object", "one per run", fields=RUN_FIELDS),
    )),
    Command("generate", "Invented names.", (
        Field("names", "array of string", "the names, in the order sampled"),
        Field("seed", "integer", "the seed used (the same seed gives the same names)"),
        Field("species", "string", 'the species asked for ("any": every pet)'),
        Field("model", "string", "the checkpoint file used"),
    )),
    Command("score", "How pet-like each name is.", (
        Field("scores", "array of object", "one per name, in the order given", fields=SCORE),
        Field("species", "string", "the species they were scored as"),
        Field("model", "string", "the checkpoint file used"),
    )),
    Command("evaluate", "A model's validation NLL.", (
        Field("val_nll", "number", "mean NLL over the validation names, nats per predicted character"),
        Field("val_names", "integer", "distinct validation names it was measured on"),
        Field("data", "string", "the data file they came from"),
        Field("model", "string", "the checkpoint file used"),
    )),
    Command("sweep", "A scaling study: one row per run, and one per setting with the spread of its repeats.", (
        Field("study_id", "string", "the study in the store"),
        Field("status", "string", f"the study's status, one of {_STATUSES}"),
        Field("equivalent", "boolean", "whether every worker count trained at the same global batch"),
        Field("target_nll", "number", "the validation NLL the times are measured to, nats per character"),
        Field("rows", "array of object", "one per run, by global batch, learning rate and workers",
              fields=SWEEP_ROW),
        Field("repeats", "integer", "runs of every setting (`--repeats`), under distinct seeds, interleaved"),
        Field("summary", "array of object", "one per setting (workers, global batch, learning rate): its repeats' "
              "median and range", fields=SWEEP_SUMMARY),
        Field("warnings", "array of string", "what makes its figures less reliable, one sentence each"),
        Field("messages", "array of string", "how it was planned, one sentence each"),
        GRID_NOTE,
    )),
    Command("runs compare", "Each run's time to the target and its speedup over an equivalent 1-worker run.", (
        Field("store", "string", "the run store's folder"),
        Field("target_nll", "number", "the validation NLL the times are measured to, nats per character"),
        Field("runs", "array of object", "one per run, in the order given", fields=COMPARE_ROW),
    )),
    Command("runs kill-worker", "The worker told to end (it ends a moment later, as a crashed one would).", (
        Field("run_id", "string", "the running run"),
        Field("rank", "integer", "the rank whose worker was ended"),
        Field("worker", "string", "the Dask worker's address"),
        Field("pid", "integer", "its process id on its host"),
    )),
    Command("runs note", "The run whose note was set (or cleared), as it now reads.", (
        Field("store", "string", "the run store's folder"),
        Field("run_id", "string", "the run"),
        Field("name", "string", "its name", nullable=True),
        Field("note", "string", "its note now; null once cleared", nullable=True),
    )),
    Command("sweep --forecast-only", "A sweep's forecast from a few seconds of calibration on the cluster; "
            "nothing trains.", (
        Field("equivalent", "boolean", "whether every worker count trains at the same global batch"),
        Field("target_nll", "number", "the validation NLL the times are forecast to, nats per character"),
        Field("rows", "array of object", "one per planned run, in the sweep's order", fields=FORECAST_ROW),
        Field("noise_scale", "object", "the gradient noise scale of earlier DDP runs of this model; null without "
              "one", nullable=True, fields=(
            Field("b_noise", "number", "B_noise, names (McCandlish et al. 2018)"),
            Field("error", "number", "its standard error (jackknife), names"),
            Field("windows", "integer", "windows it was measured on"),
            Field("small_batch", "number", "the per-rank batch it compared"),
            Field("large_batch", "number", "the global batch it compared"),
        )),
        Field("calibration_source", "string", "what was measured, where"),
        Field("calibration_seconds", "number", "how long the calibration took"),
        Field("notes", "array of string", "what the forecast stands on and could not know, one sentence each"),
        Field("warnings", "array of string", "what makes the planned comparison weaker, one sentence each"),
        Field("messages", "array of string", "how it was planned, one sentence each"),
        GRID_NOTE,
    )),
    Command("plan", "Before training: every candidate setting's forecast time to the target, the fastest first.", (
        Field("target_nll", "number", "the validation NLL the times are forecast to, nats per character"),
        Field("recommended", "object", "the setting to run: the fewest workers, then the smallest batch, among the candidates within 10% of the fastest",
              fields=PLAN_ROW),
        Field("rows", "array of object", "every candidate, the recommendation first, then by forecast time",
              fields=PLAN_ROW),
        Field("why", "array of string", "why the recommendation, in sentences made of the figures"),
        Field("steps_source", "string", "what the steps to the target were measured on: probes, or earlier runs"),
        Field("measured_steps", "array of object", "the steps to the target measured, one per global batch", fields=(
            Field("global_batch", "integer", "the global batch measured"),
            Field("steps", "number", "steps at its first validation at or below the target"),
            Field("previous_validation_steps", "number", "steps at the validation before (the crossing lies between)"),
        )),
        Field("noise_scale", "object", "B_noise fitted to the measured steps, S(B) = S_min·(1 + B_noise/B); null "
              "from a single batch", nullable=True, fields=(
            Field("b_noise", "number", "B_noise, names"),
            Field("error", "number", "how far the fits through the bracketing validations move it, names"),
            Field("windows", "integer", "measured batches it was fitted to"),
            Field("small_batch", "number", "the smallest measured global batch"),
            Field("large_batch", "number", "the largest measured global batch"),
        )),
        Field("lr_rule", "string", "the learning-rate rule, one sentence"),
        Field("calibration_source", "string", "what was measured, where"),
        Field("calibration_seconds", "number", "how long the calibration took"),
        Field("seconds", "number", "how long making the plan took, probes and calibration included"),
        Field("notes", "array of string", "what the plan stands on, one sentence each"),
        Field("train_command", "string", "the `train` command line that runs the recommendation"),
    )),
    Command("search", "A hyperparameter search: its trials and the best one.", (
        Field("study_id", "string", "the study in the store"),
        Field("status", "string", f"the study's status, one of {_STATUSES}"),
        Field("trials", "array of object", "one per trial, in the order launched", fields=TRIAL),
        Field("best", "object", "the best completed trial; null if none completed", nullable=True, fields=(
            Field("run_id", "string", "its run (marked best in the store)"),
            Field("val_nll", "number", "its validation NLL, nats per predicted character"),
            Field("params", "object", "its configuration", fields=PARAMS),
            Field("number", "integer", "its trial number"),
        )),
        Field("pruned", "integer", "trials stopped early by the pruner"),
        Field("full_length", "integer", "trials that trained their whole budget"),
        Field("failed", "integer", "trials that failed"),
        Field("concurrency", "integer", "trials run at once"),
        Field("messages", "array of string", "how it was planned, one sentence each"),
    )),
)


def command(name: str) -> Command:
    """The declared output of ``python -m petmodel NAME --json``."""
    for c in COMMANDS:
        if c.name == name:
            return c
    raise KeyError(name)


# --------------------------------------------------------------------------- checking a result
_SCALARS: dict[str, tuple[type, ...]] = {"string": (str,), "integer": (int,), "number": (int, float),
                                         "boolean": (bool,)}


def _type_problem(value: Any, type_: str, fields: tuple[Field, ...], where: str) -> list[str]:
    if type_ == "any":
        return []
    if type_ in _SCALARS:
        ok = isinstance(value, _SCALARS[type_]) and (type_ == "boolean" or not isinstance(value, bool))
        if ok and isinstance(value, float) and not math.isfinite(value):
            ok = False
        return [] if ok else [f"{where} should be {type_}, is {type(value).__name__} {value!r:.60}"]
    if type_ == "object":
        if not isinstance(value, dict):
            return [f"{where} should be an object, is {type(value).__name__}"]
        return _object_problems(value, fields, where)
    for prefix in ("array of ", "map of "):
        if type_.startswith(prefix):
            inner = type_[len(prefix):]
            if prefix == "array of ":
                if not isinstance(value, list):
                    return [f"{where} should be an array, is {type(value).__name__}"]
                items = [(f"{where}[{i}]", v) for i, v in enumerate(value)]
            else:
                if not isinstance(value, dict):
                    return [f"{where} should be a map, is {type(value).__name__}"]
                items = [(f"{where}[{k!r}]", v) for k, v in value.items()]
            out: list[str] = []
            for at, v in items:
                out += _type_problem(v, inner, fields, at)
            return out
    raise ValueError(f"unknown type {type_!r} in the JSON schema")  # a bug in the declarations above


def _object_problems(obj: dict[str, Any], fields: tuple[Field, ...], where: str) -> list[str]:
    out: list[str] = []
    known = {f.name for f in fields}
    for extra in sorted(set(obj) - known):
        out.append(f"{where}.{extra} is not documented")
    for f in fields:
        at = f"{where}.{f.name}"
        if f.name not in obj:
            if not f.optional:
                out.append(f"{at} is missing")
            continue
        value = obj[f.name]
        if value is None:
            if not f.nullable:
                out.append(f"{at} is null")
            continue
        out += _type_problem(value, f.type, f.fields, at)
    return out


def problems(name: str, result: Any) -> list[str]:
    """What in ``result`` (a command's parsed JSON) breaks its declared shape; empty when it matches."""
    if not isinstance(result, dict):
        return [f"{name}: the result should be an object, is {type(result).__name__}"]
    return _object_problems(result, command(name).fields, name)


# --------------------------------------------------------------------------- the document
BEGIN, END = "<!-- json-schema:begin (generated by python -m petmodel.cli.json_schema) -->", "<!-- json-schema:end -->"


def _rows(fields: tuple[Field, ...], prefix: str = "") -> list[str]:
    lines = []
    for f in fields:
        type_ = f.type + (" or null" if f.nullable else "")
        note = " *(optional: may be absent)*" if f.optional else ""
        lines.append(f"| `{prefix}{f.name}` | {type_} | {f.meaning}{note} |")
        if f.fields:
            lines += _rows(f.fields, f"{prefix}{f.name}{'[].' if f.type.startswith('array') else '.'}")
    return lines


def render_markdown() -> str:
    """The generated part of ``docs/JSON.md``: one section and table per command."""
    parts = [BEGIN]
    for c in COMMANDS:
        parts += ["", f"## `{c.name}`", "", c.summary, "", "| field | type | meaning |", "| --- | --- | --- |",
                  *_rows(c.fields)]
    parts += ["", END]
    return "\n".join(parts) + "\n"


def write_markdown(path: Path) -> None:
    """Replace the generated part of the document at ``path`` (its prose around it stays)."""
    text = path.read_text(encoding="utf-8")
    start, end = text.index(BEGIN), text.index(END) + len(END) + 1
    path.write_text(text[:start] + render_markdown() + text[end:], encoding="utf-8")


if __name__ == "__main__":  # pragma: no cover - a maintainer's tool
    parser = argparse.ArgumentParser(description="Print (or write into a document) the --json schema tables.")
    parser.add_argument("--write", type=Path, metavar="DOC", help="replace the generated part of DOC")
    ns = parser.parse_args()
    if ns.write:
        write_markdown(ns.write)
    else:
        sys.stdout.write(render_markdown())

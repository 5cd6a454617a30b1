"""Species conditioning: does the model know a cat's name from a dog's, and what does it cost?

Trains the species-conditioned model and the unconditioned one (``--no-species``) for the same
time on the same data, then reports each one's validation NLL, and for the conditioned model the
held-out cat and dog names scored under "cat" and under "dog" (nats per predicted character).

    python -m benchmarks.bench_species [--seconds 60] [--quick] [--json]
"""

from __future__ import annotations

import argparse
import sys
import tempfile

from benchmarks._common import load_avg, machine_info, print_json, resolve_data, table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_species", description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="training time of each model (default 60)")
    parser.add_argument("--quick", action="store_true", help="5 s each: checks the script, not a measurement")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON line at the end")
    parser.add_argument("--data", help="data file (default: what petmodel trains on by default)")
    args = parser.parse_args(argv)

    from petmodel.checkpoint import load_checkpoint
    from petmodel.config import DEFAULT_SPEC
    from petmodel.data import encode_names, load_corpus
    from petmodel.runner import train_in_process
    from petmodel.store import RunStore
    from petmodel.nll import evaluate_nll

    seconds = 5.0 if args.quick else args.seconds
    corpus = load_corpus(resolve_data(args.data))
    store = RunStore(tempfile.mkdtemp(prefix="bench-species-"))
    load_start = load_avg()
    results = {}
    for label, species in (("conditioned", True), ("unconditioned", False)):
        spec = DEFAULT_SPEC.with_(max_seconds=seconds, species=species)
        results[label] = train_in_process(spec, store, corpus=corpus)
    ckpt = load_checkpoint(results["conditioned"]["model_path"])
    model = ckpt.build_model()
    groups = {"cat": [], "dog": []}
    for name, group in zip(corpus.val_names, corpus.val_species):
        if group in groups:
            groups[group].append(name)
    cross = {}
    for names_of, names in groups.items():
        for scored_as in groups:
            data = encode_names(names, ckpt.alphabet, [scored_as] * len(names))
            cross[f"{names_of} names as {scored_as}"] = evaluate_nll(model, data)
    rows = [[k, f"{v:.4f}"] for k, v in cross.items()]
    rows += [[f"validation NLL, {k} model", f"{v['val_nll']:.4f}"] for k, v in results.items()]
    print(table(["held-out names", "NLL (nats/char)"], rows,
                title=f"Species conditioning, {seconds:g} s of training each ({len(groups['cat'])} cat and "
                      f"{len(groups['dog'])} dog validation names)"))
    if args.json:
        print_json({"benchmark": "species", "quick": args.quick, "seconds": seconds, "machine": machine_info(),
                    "load_avg_start": load_start, "cross": cross,
                    "val_nll": {k: v["val_nll"] for k, v in results.items()}})
    return 0


if __name__ == "__main__":
    sys.exit(main())

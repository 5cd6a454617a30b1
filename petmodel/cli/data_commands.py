"""``data show`` and ``data refresh``: what the training data holds, and getting the latest export."""

from __future__ import annotations

import argparse
from typing import Any

from petmodel.cli.args import say


def add_data_commands(sub: Any) -> None:
    """Add ``data show`` and ``data refresh`` to the CLI's subparsers."""
    d = sub.add_parser("data", help="show or refresh the training data",
                       description="Which data runs train on, and what it holds. Without --data: $PETMODEL_DATA, "
                                   "else the export `data refresh` cached, else the packaged Seattle snapshot.")
    actions = d.add_subparsers(dest="action", required=True, metavar="ACTION")
    show = actions.add_parser("show", help="rows read, kept and dropped, species, common names")
    show.add_argument("--data", metavar="PATH", help="a data file to describe instead of the default data")
    show.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    show.set_defaults(handler=cmd_data_show)
    refresh = actions.add_parser("refresh", help="download the latest official export into the cache")
    refresh.add_argument("--timeout", type=float, default=15.0, help="give up after S seconds (default %(default)s)")
    refresh.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    refresh.set_defaults(handler=cmd_data_refresh)


def cmd_data_show(args: argparse.Namespace) -> dict[str, Any]:
    from petmodel.data_report import DROP_REASONS, build_report

    report = build_report(args.data)
    if not args.json:
        dropped = "; ".join(f"{n:,} {DROP_REASONS[reason]}" for reason, n in sorted(report.dropped.items())) or "none"
        print(f"data:       {report.source.label}")
        print(f"rows:       {report.rows:,} read, {report.kept:,} kept, dropped: {dropped}")
        print(f"names:      {report.distinct:,} distinct; {report.train_names:,} training, "
              f"{report.val_names:,} validation (crc32(name) % 10 == 0)")
        if report.species:
            print("species:    " + ", ".join(f"{k} {v:,}" for k, v in sorted(report.species.items(),
                                                                            key=lambda kv: -kv[1])))
        print("common:     " + ", ".join(f"{n} ({c})" for n, c in report.top_names.get("all", [])[:10]))
    return report.to_dict()


def cmd_data_refresh(args: argparse.Namespace) -> dict[str, Any]:
    from petmodel.download import refresh_export

    say(args, "Downloading the latest Seattle Pet Licenses export…")
    path = refresh_export(timeout=args.timeout, progress=not args.json)
    from petmodel.data_report import build_report

    report = build_report(str(path))
    say(args, f"Saved {report.rows:,} rows; runs now train on it unless --data or $PETMODEL_DATA says otherwise.")
    return {"path": str(path), "rows": report.rows, "kept": report.kept}

"""`aieng demo-data`, `aieng data report --partition D`, `aieng data status`: the landed data
and what the pipeline made of it."""

from __future__ import annotations

import argparse
import datetime as dt
import sys

from aieng_core.home import raw_partition_dir, resolve_home
from aieng_core.output import emit
from aieng_core.store import ArtifactStore


def cmd_demo_data(args: argparse.Namespace) -> int:
    from aieng_core.data.demo_data import land_demo_data

    home = resolve_home(args.home)
    from aieng_core.config import load_config  # pydantic: only for commands that read the config

    start = args.start or load_config(args.config).data.start_date
    folders = [raw_partition_dir(home, (start + dt.timedelta(days=n)).isoformat()) for n in range(args.days)]
    if args.if_missing and all(folder.is_dir() and any(folder.iterdir()) for folder in folders):
        print(f"demo data already landed under {home / 'raw'}; leaving it as it is", file=sys.stderr)
        return 0
    written = land_demo_data(home, start_date=start, days=args.days, overwrite=args.overwrite)
    days = sorted({path.parent.name for path in written})
    result = {"home": str(home), "partitions": days, "files": [str(path) for path in written]}
    emit(
        result,
        args.json,
        lambda r: "\n".join(
            [f"landed {len(r['files'])} files for {len(r['partitions'])} days under {home / 'raw'}:"]
            + [f"  {path}" for path in r["files"]]
            + [f"partitions: {r['partitions'][0]}...{r['partitions'][-1]}"]
        ),
    )
    return 0


def cmd_data_report(args: argparse.Namespace) -> int:
    from aieng_core.data.report import format_report, partition_report

    report = partition_report(ArtifactStore(resolve_home(args.home)), args.partition)
    emit(report, args.json, format_report)
    return 0


def cmd_data_status(args: argparse.Namespace) -> int:
    from aieng_core.config import load_config
    from aieng_core.status import format_status, pipeline_status

    start_date = load_config(args.config).data.start_date  # which folders are partitions at all
    emit(pipeline_status(ArtifactStore(resolve_home(args.home)), start_date), args.json, format_status)
    return 0


def _date(value: str) -> dt.date:
    try:
        return dt.date.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a date in YYYY-MM-DD form") from None


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = commands.add_parser("demo-data", help="land a few days of sample raw data (real text, a few dirty rows)")
    demo.add_argument("--start", type=_date, help="first day (default: data.start_date of the config)")
    demo.add_argument("--days", type=int, default=3, help="number of days to land (default 3)")
    demo.add_argument("--overwrite", action="store_true", help="replace demo files already landed")
    demo.add_argument("--if-missing", action="store_true", help="do nothing if every day already has landed files")
    demo.add_argument("--json", action="store_true")
    demo.set_defaults(handler=cmd_demo_data)

    data = commands.add_parser("data", help="data quality")
    data_commands = data.add_subparsers(dest="data_command", required=True, metavar="SUBCOMMAND")
    report = data_commands.add_parser("report", help="rows in, clean and quarantined (by reason) for one partition")
    report.add_argument("--partition", required=True, help="daily partition, YYYY-MM-DD")
    report.add_argument("--json", action="store_true")
    report.set_defaults(handler=cmd_data_report)

    status = data_commands.add_parser("status", help="the current artifact of every data asset and partition")
    status.add_argument("--json", action="store_true")
    status.set_defaults(handler=cmd_data_status)

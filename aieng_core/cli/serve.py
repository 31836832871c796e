"""`aieng serve --bundle PATH | --deployment current [--pointer NAME] [--request-log PATH | --no-request-log]`."""

from __future__ import annotations

import argparse
from pathlib import Path

from aieng_core.home import resolve_home
from aieng_core.store.pointers import PRODUCTION, validate_pointer_name
from aieng_core.store.request_log import default_request_log


def cmd_serve(args: argparse.Namespace) -> int:
    from aieng_core.config import load_config, resolve_config_path
    from aieng_core.serving.http.server import run_server

    if args.pointer is not None and not args.deployment:
        raise ValueError("--pointer names the deployment pointer to follow: use it with --deployment current")
    pointer = validate_pointer_name(args.pointer or PRODUCTION)
    home = resolve_home(args.home)
    config_path = resolve_config_path(args.config)  # the server re-reads it on each scrape (aieng_config_valid)
    if args.no_request_log:
        request_log = None
    else:
        request_log = Path(args.request_log).expanduser() if args.request_log else default_request_log(home)
    return run_server(
        bundle_path=Path(args.bundle) if args.bundle else None,
        host=args.host,
        port=args.port,
        config=load_config(config_path),
        log_level=args.log_level,
        follow_home=home if args.deployment else None,
        pointer=pointer,
        request_log=request_log,
        request_log_given=args.request_log is not None,
        config_path=config_path,
    )


def add_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    serve = commands.add_parser(
        "serve", help="serve a bundle over HTTP (OpenAI-compatible completions and chat completions)"
    )
    serving_what = serve.add_mutually_exclusive_group(required=True)
    serving_what.add_argument("--bundle", help="the serving bundle directory (`aieng bundle current --path`)")
    serving_what.add_argument(
        "--deployment",
        choices=["current"],
        help="follow a deployment pointer (--pointer; production by default): a promote or rollback swaps the bundle",
    )
    serve.add_argument(
        "--pointer",
        metavar="NAME",
        help=f"with --deployment current: the pointer to follow (default {PRODUCTION})",
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    serve.add_argument("--port", type=int, default=8000, help="port to bind (default 8000)")
    logged = serve.add_mutually_exclusive_group()
    logged.add_argument(
        "--request-log",
        metavar="PATH",
        help="append one JSON line per answered request (request id, bundle id, data version, status, latency) "
        "to PATH, read by `aieng lineage --request ID` (default $AIENG_HOME/logs/requests.jsonl)",
    )
    logged.add_argument(
        "--no-request-log", action="store_true", help="keep no request log (`aieng lineage --request` cannot answer)"
    )
    serve.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"], help="log level (default info)"
    )
    serve.set_defaults(handler=cmd_serve)

"""The whole loop, with nothing typed once it runs: a file lands, and production serves a model
trained on it, or the gate says why not.

    .venv/bin/python scripts/landing_to_production_demo.py --root /tmp/loop [--config configs/tiny.yaml]

1. A fresh home under ROOT: the demo's three days through the whole graph and the gate with
   the Dagster CLI (production's first bundle), as `make run` does.
2. `dagster dev` in its own process group on that home, the sensors that launch runs turned
   on (landing_sensor, retrain_sensor, retrain_chain_automation, serving_bundle_sensor), and
   `aieng serve --deployment current` following production.
3. A fourth day lands (the demo generator's next day). The script only watches: the time until
   the server answers with a bundle whose lineage reaches the landed file is the figure.
4. A fifth day lands that makes a worse model (random letters, more text than the rest): the
   gate run must fail, production and the served bundle unchanged.

The config is copied with `landing.settle_seconds` 5 and `gate.retrain_min_interval_minutes` 0
so the demo does not wait for the defaults' safety margins, and `training.max_minutes` 30. One JSON document on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
SENSORS = ["landing_sensor", "retrain_sensor", "retrain_chain_automation", "serving_bundle_sensor"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run(env: dict[str, str], *args: str, timeout: float = 1800) -> str:
    done = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.stdout


def lineage_files(env: dict[str, str]) -> set[str]:
    """Every landed file path the production bundle's lineage reaches."""
    graph = json.loads(run(env, str(BIN / "aieng"), "lineage", "current", "--json"))
    return {source["path"] for node in graph["nodes"].values() for source in node.get("sources", [])}


def served_bundle(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/version", timeout=5) as response:
            return json.loads(response.read())["bundle_id"]
    except (OSError, ValueError, KeyError):
        return None


def production(env: dict[str, str]) -> dict[str, Any]:
    return json.loads(run(env, str(BIN / "aieng"), "deploy", "status", "--json"))["current"]


def wait(what: str, done: Any, timeout_s: float, poll_s: float = 5.0) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if done():
            return time.monotonic() - started
        time.sleep(poll_s)
    raise SystemExit(f"timed out after {timeout_s:.0f} s waiting for {what}")


def gate_runs(env: dict[str, str], port: int) -> list[dict[str, Any]]:
    query = (
        '{ runsOrError(filter: {pipelineName: "deploy"}) '
        "{ ... on Runs { results { runId status tags { key value } } } } }"
    )
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql",
        data=json.dumps({"query": query}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())["data"]["runsOrError"]["results"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", required=True, type=Path)
    parser.add_argument("--config", default="configs/tiny.yaml", type=Path)
    parser.add_argument("--timeout", type=float, default=1800, help="seconds each wait may take")
    args = parser.parse_args()
    root = args.root.resolve()
    shutil.rmtree(root, ignore_errors=True)
    (root / "dagster").mkdir(parents=True)
    config = yaml.safe_load((REPO / args.config).read_text(encoding="utf-8"))
    config.setdefault("landing", {})["settle_seconds"] = 5
    config.setdefault("gate", {})["retrain_min_interval_minutes"] = 0
    # A busy machine must not stop a training half-way (a partial model is never bundled).
    config.setdefault("training", {})["max_minutes"] = 30
    (root / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    shutil.copy(REPO / "configs" / "dagster.yaml", root / "dagster" / "dagster.yaml")
    env = {
        **os.environ,
        "AIENG_HOME": str(root / "home"),
        "AIENG_CONFIG": str(root / "config.yaml"),
        "DAGSTER_HOME": str(root / "dagster"),
    }
    dagster = str(BIN / "dagster")
    aieng = str(BIN / "aieng")
    result: dict[str, Any] = {"config": str(args.config)}

    started = time.monotonic()
    run(env, aieng, "demo-data")
    run(env, dagster, "asset", "materialize", "-m", "orchestration.definitions", "--select", "*",
        "--partition-range", "2026-01-01...2026-01-03")  # fmt: skip
    first = production(env)
    result["bootstrap"] = {"seconds": round(time.monotonic() - started, 1), "production": first}

    port, serve_port = free_port(), free_port()
    dev_log = (root / "dagster-dev.log").open("wb")
    dev = subprocess.Popen(
        [dagster, "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)],
        cwd=REPO, env={**env, "AIENG_DAGSTER_URL": f"http://127.0.0.1:{port}"},
        stdout=dev_log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    serve_log = (root / "serve.log").open("wb")
    server = subprocess.Popen(
        [aieng, "serve", "--deployment", "current", "--port", str(serve_port)],
        cwd=REPO, env=env, stdout=serve_log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        wait("the webserver", lambda: _answers(port), 300, 2)
        for sensor in SENSORS:
            run(env, dagster, "sensor", "start", "-w", "workspace.yaml", sensor)
        wait("the server", lambda: served_bundle(serve_port) == first["bundle_id"], 300, 2)

        # A new day lands: the demo generator's fourth day.
        landed_at = time.monotonic()
        run(env, aieng, "demo-data", "--start", "2026-01-04", "--days", "1")
        new_files = {str(p) for p in (root / "home" / "raw" / "2026-01-04").iterdir()}
        seconds = wait(
            "production to serve a bundle trained on the new day",
            lambda: served_bundle(serve_port) not in (None, first["bundle_id"]) and new_files <= lineage_files(env),
            args.timeout,
        )
        second = production(env)
        result["new_day"] = {
            "landed": sorted(new_files),
            "seconds_landing_to_serving": round(time.monotonic() - landed_at, 1),
            "waited_s": round(seconds, 1),
            "production": second,
            "served": served_bundle(serve_port),
        }

        # A day that makes a worse model: random letters, far more of them than the real text.
        rng = random.Random(5)
        junk = root / "home" / "raw" / "2026-01-05"
        junk.mkdir()
        with (junk / "noise.jsonl").open("w", encoding="utf-8") as out:
            for n in range(3000):
                text = " ".join("".join(rng.choice("qxzjvkw") for _ in range(rng.randint(3, 9))) for _ in range(60))
                out.write(json.dumps({"id": f"noise-{n}", "text": text}) + "\n")
        landed_at = time.monotonic()
        before = len(gate_runs(env, port))

        def refused() -> bool:
            runs = gate_runs(env, port)
            return len(runs) > before and runs[0]["status"] in ("FAILURE", "SUCCESS")

        wait("the gate's verdict on the worse model", refused, args.timeout)
        verdict = gate_runs(env, port)[0]
        after = production(env)
        result["worse_day"] = {
            "seconds_landing_to_verdict": round(time.monotonic() - landed_at, 1),
            "gate_run": verdict,
            "production_unchanged": after == second,
            "served": served_bundle(serve_port),
            "gate_status": json.loads(run(env, aieng, "deploy", "status", "--json")).get("last_gate"),
        }
    finally:
        for process in (server, dev):
            try:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(process.pid, signal.SIGKILL)
    print(json.dumps(result, indent=2))
    return 0


def _answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=5):
            return True
    except OSError:
        return False


if __name__ == "__main__":
    raise SystemExit(main())

"""A throwaway PostgreSQL server for tests: Debian's binaries, a fresh cluster in a temporary
directory, 127.0.0.1 on a free port, stopped and removed afterwards whatever the test did."""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import psycopg2

HOST = "127.0.0.1"
USER = "aieng_test"
DB_NAME = "dagster"
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30
MISSING_BINARIES = (
    "PostgreSQL server binaries not found (/usr/lib/postgresql/*/bin/initdb): install Debian's "
    "`postgresql` package (`make system-deps` does)"
)


@dataclass(frozen=True)
class PostgresServer:
    host: str
    port: int
    user: str
    password: str
    db_name: str
    data_dir: Path
    pid: int  # the postmaster's

    def cpu_seconds(self) -> float:
        """CPU the server has used so far: the postmaster, its live processes, and the backends
        it has reaped (a backend ends with its connection)."""
        postmaster = psutil.Process(self.pid)
        processes = [postmaster, *postmaster.children(recursive=True)]
        total = 0.0
        for process in processes:
            try:
                times = process.cpu_times()
            except psutil.NoSuchProcess:
                continue  # ended since it was listed; counted in the postmaster's reaped children
            total += times.user + times.system + times.children_user + times.children_system
        return total

    def dagster_env(self) -> dict[str, str]:
        """The variables configs/dagster-postgres.yaml reads its connection from."""
        return {
            "DAGSTER_PG_HOST": self.host,
            "DAGSTER_PG_PORT": str(self.port),
            "DAGSTER_PG_USER": self.user,
            "DAGSTER_PG_PASSWORD": self.password,
            "DAGSTER_PG_DB": self.db_name,
        }

    def connect(self, db_name: str | None = None) -> Any:
        return psycopg2.connect(
            host=self.host,
            port=self.port,
            user=self.user,
            password=self.password,
            dbname=db_name or self.db_name,
            connect_timeout=5,
        )


def postgres_bin_dir() -> Path | None:
    """The newest installed server version's bin directory (Debian keeps them side by side)."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parent.parent.name))
    return found[-1].parent if found else None


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _as_server_user() -> dict[str, Any]:
    """initdb and postgres refuse to run as root: run them as the `postgres` account Debian's
    package creates. As anyone else they run as that user."""
    if os.geteuid() != 0:
        return {}
    account = pwd.getpwnam("postgres")
    return {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}


@contextmanager
def running_postgres() -> Iterator[PostgresServer]:
    bin_dir = postgres_bin_dir()
    if bin_dir is None:
        raise FileNotFoundError(MISSING_BINARIES)
    as_server_user = _as_server_user()
    # Not under pytest's tmp_path: its parents are private to the test user (0700), and the
    # server runs as `postgres`. A short path also keeps the socket path under its length limit.
    root = Path(tempfile.mkdtemp(prefix="aieng-pg-"))
    data_dir, socket_dir, log_path = root / "data", root / "socket", root / "postgres.log"
    socket_dir.mkdir()
    password = secrets.token_hex(16)
    password_file = root / "password"
    password_file.write_text(password + "\n")
    if as_server_user:
        for path in (root, socket_dir, password_file):
            os.chown(path, as_server_user["user"], as_server_user["group"])
    process: subprocess.Popen[bytes] | None = None
    try:
        subprocess.run(
            [
                str(bin_dir / "initdb"),
                f"--pgdata={data_dir}",
                f"--username={USER}",
                f"--pwfile={password_file}",
                "--auth=scram-sha-256",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",  # a throwaway cluster: skip flushing the fresh files to disk
            ],
            check=True,
            capture_output=True,
            timeout=120,
            **as_server_user,
        )
        port = free_port()
        with log_path.open("wb") as log:
            # Its own session, so the teardown can kill the whole process group.
            process = subprocess.Popen(
                [str(bin_dir / "postgres"), "-D", str(data_dir), "-h", HOST, "-p", str(port), "-k", str(socket_dir)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                **as_server_user,
            )
        server = PostgresServer(HOST, port, USER, password, DB_NAME, data_dir, process.pid)
        _wait_until_ready(server, process, log_path)
        admin = server.connect("postgres")
        try:
            admin.autocommit = True  # CREATE DATABASE cannot run inside a transaction
            with admin.cursor() as cursor:
                cursor.execute(f"CREATE DATABASE {DB_NAME}")
        finally:
            admin.close()
        yield server
    except subprocess.CalledProcessError as error:
        raise RuntimeError(f"initdb failed ({error.returncode}): {error.stdout!r} {error.stderr!r}") from error
    finally:
        if process is not None:
            _stop(bin_dir, data_dir, process, as_server_user)
        shutil.rmtree(root, ignore_errors=True)


def _wait_until_ready(server: PostgresServer, process: subprocess.Popen[bytes], log_path: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"postgres exited {process.returncode} on start:\n{log_path.read_text()[-3000:]}")
        try:
            server.connect("postgres").close()
            return
        except psycopg2.OperationalError as error:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"postgres did not accept connections within {READY_TIMEOUT_S:.0f} s: {error}\n"
                    f"{log_path.read_text()[-3000:]}"
                ) from error
        time.sleep(0.1)


def _stop(bin_dir: Path, data_dir: Path, process: subprocess.Popen[bytes], as_server_user: dict[str, Any]) -> None:
    """A fast shutdown (clients disconnected, no wait for them); SIGKILL to the process group if
    that does not end it in time."""
    try:
        if process.poll() is None:
            subprocess.run(
                [str(bin_dir / "pg_ctl"), "stop", "-D", str(data_dir), "-m", "fast", "-w", "-t", str(STOP_TIMEOUT_S)],
                capture_output=True,
                timeout=STOP_TIMEOUT_S + 10,
                check=False,
                **as_server_user,
            )
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pass
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # whatever of the group outlived the postmaster
        except ProcessLookupError:
            pass
        process.wait(timeout=STOP_TIMEOUT_S)

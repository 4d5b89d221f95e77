"""A throw-away PostgreSQL server from Debian's ``postgresql`` package (tests, benchmarks).

``initdb`` refuses to run as root, and CI runs as root: the server then runs as
``nobody`` (``setpriv``), in a fresh temporary directory, listening on 127.0.0.1
only, on a free port, with fsync off. :meth:`ThrowawayPostgres.stop` stops it
(immediate mode) and removes the directory. Given a password, the ``postgres``
role needs it over TCP (``scram-sha-256``); without one, TCP is trusted.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile

__all__ = ["PostgresUnavailable", "ThrowawayPostgres", "postgres_bindir"]


class PostgresUnavailable(RuntimeError):
    """Debian's postgresql package (initdb, pg_ctl) is not installed."""


def postgres_bindir() -> str:
    """Return the newest ``/usr/lib/postgresql/*/bin`` holding initdb and pg_ctl. O(versions)."""
    dirs = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), key=lambda d: int(d.split("/")[-2].split(".")[0])
    )
    for bindir in reversed(dirs):
        if os.path.exists(os.path.join(bindir, "initdb")):
            return bindir
    raise PostgresUnavailable(
        "no PostgreSQL server binaries under /usr/lib/postgresql/*/bin: "
        "install Debian's postgresql package (scripts/system-deps.sh)"
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class ThrowawayPostgres:
    """Start a private PostgreSQL server; use as a context manager or call start/stop."""

    def __init__(self, password: str | None = None) -> None:
        """Prepare (do not start) a server in a new temporary directory.

        With ``password``, TCP connections (the JDBC sinks' and :meth:`psql`'s)
        authenticate with it by ``scram-sha-256``.
        """
        self.password = password
        self.bindir = postgres_bindir()
        self.dir = tempfile.mkdtemp(prefix="tickwheel-pg-")
        self.data = os.path.join(self.dir, "data")
        self.port = 0
        self._as_user: list[str] = []
        self._running = False

    @property
    def jdbc_url(self) -> str:
        """``jdbc:postgresql://127.0.0.1:PORT/postgres?user=postgres``."""
        return f"jdbc:postgresql://127.0.0.1:{self.port}/postgres?user=postgres"

    def _run(self, *args: str) -> None:
        proc = subprocess.run(
            [*self._as_user, *args], capture_output=True, text=True, timeout=120, check=False
        )
        if proc.returncode != 0:
            log = os.path.join(self.dir, "server.log")
            tail = ""
            if os.path.exists(log):
                with open(log, encoding="utf-8", errors="replace") as fh:
                    tail = fh.read()[-2000:]
            raise RuntimeError(
                f"{os.path.basename(args[0])} failed ({proc.returncode}): "
                f"{proc.stderr.strip()[-2000:]}\n{tail}"
            )

    def _auth_options(self) -> list[str]:
        """initdb's options: trust, or the password (in a file initdb reads) over TCP."""
        if self.password is None:
            return ["--auth=trust"]
        pwfile = os.path.join(self.dir, "pwfile")
        with open(pwfile, "w", encoding="utf-8") as fh:
            fh.write(self.password + "\n")
        if self._as_user:  # initdb runs as nobody: let it read the file
            nobody = pwd.getpwnam("nobody")
            os.chown(pwfile, nobody.pw_uid, nobody.pw_gid)
        os.chmod(pwfile, 0o600)
        return ["--auth-local=trust", "--auth-host=scram-sha-256", f"--pwfile={pwfile}"]

    def start(self) -> ThrowawayPostgres:
        """initdb + pg_ctl start on 127.0.0.1 and a free port; wait until it accepts. ~1 s."""
        os.chmod(self.dir, 0o755)
        os.mkdir(self.data, 0o700)
        if os.getuid() == 0:  # initdb refuses root: run the server as nobody
            nobody = pwd.getpwnam("nobody")
            for path in (self.dir, self.data):
                os.chown(path, nobody.pw_uid, nobody.pw_gid)
            self._as_user = [
                "setpriv",
                f"--reuid={nobody.pw_uid}",
                f"--regid={nobody.pw_gid}",
                "--clear-groups",
            ]
        self._run(
            os.path.join(self.bindir, "initdb"),
            "-D",
            self.data,
            "-U",
            "postgres",
            *self._auth_options(),
            "-E",
            "UTF8",
            "--no-sync",
        )
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(self.dir, "pwfile"))
        self.port = _free_port()
        options = f"-h 127.0.0.1 -p {self.port} -k {self.dir} -c fsync=off -c full_page_writes=off"
        self._run(
            os.path.join(self.bindir, "pg_ctl"),
            "-D",
            self.data,
            "-l",
            os.path.join(self.dir, "server.log"),
            "-w",
            "-t",
            "60",
            "-o",
            options,
            "start",
        )
        self._running = True
        return self

    def psql(self, sql: str, database: str = "postgres") -> str:
        """Run ``sql`` in ``database`` with psql; return its unaligned output. O(query)."""
        proc = subprocess.run(
            [
                os.path.join(self.bindir, "psql"),
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-U",
                "postgres",
                "-d",
                database,
                "-At",
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
                sql,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
            env={**os.environ, **({"PGPASSWORD": self.password} if self.password else {})},
        )
        return proc.stdout

    def stop(self) -> None:
        """Stop the server (immediate) and delete its directory. Safe to call twice."""
        if self._running:
            self._running = False
            try:
                self._run(
                    os.path.join(self.bindir, "pg_ctl"), "-D", self.data, "-m", "immediate", "stop"
                )
            finally:
                shutil.rmtree(self.dir, ignore_errors=True)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> ThrowawayPostgres:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

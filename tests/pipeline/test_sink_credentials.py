"""Credentials stay secret: the PostgreSQL password from the environment or a pgpass file.

Unit tests of :func:`redact_url`, :func:`postgres_credentials` and the password
file (libpq's format and rules, with a hypothesis round trip); then the stream
CLI against a password-protected throw-away server, the password given by a
password file, and every byte the run wrote or printed searched for it.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from stream_support import fresh, subprocess_env, write_rules

from tickwheel.pipeline.generate import generate_orders
from tickwheel.pipeline.sinks import (
    PasswordFileWarning,
    PostgresSink,
    SinkError,
    pgpass_password,
    postgres_credentials,
    redact_url,
)

#: The password of the end-to-end tests: a colon and a backslash for the escapes,
#: and a core that no other text holds, to search for.
CORE = "Zq7-tick-9Hw"
SECRET = f"{CORE}:a\\b"
URL = "jdbc:postgresql://db.example:5433/shop"


def _pgpass(path: Path, *lines: str, mode: int = 0o600) -> dict[str, str]:
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    path.chmod(mode)
    return {"PGPASSFILE": str(path)}


def _escape(text: str) -> str:
    """A pgpass field for ``text``: ``\\`` and ``:`` escaped, and a leading ``#`` too,
    which would make the line a comment (libpq drops a backslash before any character)."""
    escaped = text.replace("\\", "\\\\").replace(":", "\\:")
    return "\\" + escaped if escaped.startswith("#") else escaped


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"{URL}?user=u&password=pw&ssl=true", f"{URL}?user=u&password=***&ssl=true"),
        (f"{URL}?PASSWORD=pw&sslpassword=k&x_token=t",
         f"{URL}?PASSWORD=***&sslpassword=***&x_token=***"),
        ("jdbc:postgresql://u:p@ss@db.example/shop?a=1", "jdbc:postgresql://u:***@db.example/shop?a=1"),
        ("jdbc:postgresql://u@db.example/shop", "jdbc:postgresql://u@db.example/shop"),
        ("jdbc:sqlite:/tmp/out.db", "jdbc:sqlite:/tmp/out.db"),
    ],
)  # fmt: skip
def test_descriptions_redact_secrets(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_the_url_keeps_no_secret_and_says_where_the_password_came_from() -> None:
    """Secrets leave the URL for the connection properties; describe() holds none."""
    creds = postgres_credentials(f"{URL}?user=u&password=pw1&sslpassword=k1&ssl=true", {})
    assert creds.url == f"{URL}?user=u&ssl=true"
    assert dict(creds.properties) == {"user": "u", "password": "pw1", "sslpassword": "k1"}
    assert creds.source == "from the URL"
    assert "pw1" not in repr(creds) and "k1" not in repr(creds)
    assert "pw1" not in creds.describe()
    authority = postgres_credentials("jdbc:postgresql://u2:p%40w@db.example/shop", {})
    assert authority.url == "jdbc:postgresql://db.example/shop"
    assert (authority.user, authority.properties["password"]) == ("u2", "p@w")
    env = {"PGPASSWORD": "pw2", "PGUSER": "envuser"}
    from_env = postgres_credentials(URL, env)
    assert (from_env.user, from_env.properties["password"]) == ("envuser", "pw2")
    assert from_env.describe() == f"{URL} (user envuser, password from PGPASSWORD)"


def test_the_server_can_come_from_the_environment() -> None:
    env = {"PGHOST": "db.example", "PGPORT": "5433", "PGDATABASE": "shop", "PGUSER": "u"}
    assert postgres_credentials(None, env).url == URL
    with pytest.raises(SinkError, match="--jdbc-url"):
        postgres_credentials(None, {})
    with pytest.raises(SinkError, match="socket directory"):
        postgres_credentials(None, {"PGHOST": "/var/run/postgresql"})
    with pytest.raises(SinkError, match=r"password=\*\*\*"):
        postgres_credentials("postgresql://h/db?password=pw", {})


def test_password_precedence_follows_libpq(tmp_path: Path) -> None:
    """URL, then PGPASSWORD (unless empty), then the password file, then none."""
    env = _pgpass(tmp_path / "pgpass", "db.example:5433:shop:u:from-file")
    assert postgres_credentials(f"{URL}?user=u", env).properties["password"] == "from-file"
    assert postgres_credentials(f"{URL}?user=u", env | {"PGPASSWORD": ""}).properties[
        "password"
    ] == ("from-file")
    assert postgres_credentials(f"{URL}?user=u", env | {"PGPASSWORD": "e"}).properties[
        "password"
    ] == ("e")
    creds = postgres_credentials(f"{URL}?user=u&password=p", env | {"PGPASSWORD": "e"})
    assert creds.properties["password"] == "p"
    nobody = postgres_credentials(f"{URL}?user=other", env)
    assert "password" not in nobody.properties
    assert nobody.source == "none"
    via_file = postgres_credentials(f"{URL}?user=u", env)
    assert via_file.source == f"from the password file {tmp_path / 'pgpass'}"


def test_pgpass_format(tmp_path: Path) -> None:
    """libpq's format: fields, * wildcards, backslash escapes, first match, comments."""
    env = _pgpass(
        tmp_path / "pgpass",
        "#h:1:d:u:commented",
        "",
        "other:5433:shop:u:wrong-host",
        r"db.example:5433:sh\:op:u:escaped-db",
        r"db.example:*:*:u:p\:w\\x:ignored after an unescaped colon",
        r"\*:1:d:v:literal-star",
        "*:*:*:*:catch-all\r",
    )
    assert pgpass_password("db.example", "5433", "shop", "u", env) == (
        r"p:w\x",
        str(tmp_path / "pgpass"),
    )
    assert pgpass_password("db.example", "5433", "sh:op", "u", env)[0] == "escaped-db"
    assert pgpass_password("*", "1", "d", "v", env)[0] == "literal-star"
    assert pgpass_password("elsewhere", "1", "d", "v", env)[0] == "catch-all"
    assert pgpass_password("#h", "1", "d", "u", env)[0] == "catch-all"  # a comment is no line
    missing = {"PGPASSFILE": str(tmp_path / "none")}
    assert pgpass_password("h", "1", "d", "u", missing) == (None, str(tmp_path / "none"))


def test_pgpass_default_is_the_home_directorys(tmp_path: Path) -> None:
    (tmp_path / ".pgpass").write_text("*:*:*:*:home\n", encoding="utf-8")
    (tmp_path / ".pgpass").chmod(0o600)
    assert pgpass_password("h", "1", "d", "u", {"HOME": str(tmp_path)})[0] == "home"


def test_pgpass_refuses_a_file_others_may_read(tmp_path: Path) -> None:
    """libpq ignores, with a warning, a password file its group or others may access."""
    for mode in (0o640, 0o604, 0o610):
        env = _pgpass(tmp_path / "pgpass", "*:*:*:*:secret", mode=mode)
        with pytest.warns(PasswordFileWarning, match="group or world access"):
            assert pgpass_password("h", "1", "d", "u", env)[0] is None
    (tmp_path / "dir").mkdir(mode=0o700)
    with pytest.warns(PasswordFileWarning, match="not a plain file"):
        assert pgpass_password("h", "1", "d", "u", {"PGPASSFILE": str(tmp_path / "dir")})[0] is None
    env = _pgpass(tmp_path / "pgpass", "*:*:*:*:secret", mode=0o400)
    assert pgpass_password("h", "1", "d", "u", env)[0] == "secret"


_TEXT = st.text(st.characters(exclude_characters="\n\r\x00", codec="utf-8"), max_size=12)


@given(host=_TEXT, database=_TEXT, user=_TEXT, password=_TEXT)
def test_pgpass_escapes_round_trip(host: str, database: str, user: str, password: str) -> None:
    """Any values, escaped as libpq documents, are read back exactly, and only they match."""
    import tempfile

    line = ":".join(_escape(v) for v in (host, "5432", database, user, password))
    with tempfile.TemporaryDirectory() as tmp:
        env = _pgpass(Path(tmp) / "pgpass", line)
        if "*" not in (host, database, user):
            assert pgpass_password(host + "x", "5432", database, user, env)[0] is None
        assert pgpass_password(host, "5432", database, user, env)[0] == password


# ----------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    """A throw-away PostgreSQL whose ``postgres`` role needs :data:`SECRET` over TCP."""
    from support.pgserver import ThrowawayPostgres

    with ThrowawayPostgres(password=SECRET) as pg:
        yield pg


def _leaks(*texts: str | bytes) -> list[str]:
    found = []
    for text in texts:
        data = text.encode("utf-8", "replace") if isinstance(text, str) else text
        for secret in (SECRET, CORE):
            if secret.encode() in data:
                found.append(secret)
    return found


def _files_holding_the_secret(root: Path) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and _leaks(p.read_bytes())]


def _run_stream(tmp: Path, server: Any, database: str, env: dict[str, str]) -> Any:
    server.psql(f"CREATE DATABASE {database}")
    generate_orders(40, tmp / "in", seed=3, files=2)
    url = f"jdbc:postgresql://127.0.0.1:{server.port}/{database}?user=postgres"
    args = ["--rules", str(write_rules(tmp / "rules.toml")), "--input", str(tmp / "in")]
    args += ["--output", str(tmp / "out"), "--checkpoint", str(tmp / "ck")]
    args += ["--sink", "postgresql", "--jdbc-url", url, "--trigger", "available-now"]
    full = subprocess_env()
    for name in ("PGPASSWORD", "PGPASSFILE", "PGUSER", "PGHOST", "PGPORT", "PGDATABASE"):
        full.pop(name, None)
    full.update(env)
    return subprocess.run(
        [sys.executable, "-m", "tickwheel", "pipeline", "stream", *args],
        env=full,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def _assert_secret_nowhere(tmp: Path, server: Any, database: str, proc: Any) -> None:
    assert _leaks(proc.stdout, proc.stderr) == []
    assert _files_holding_the_secret(tmp / "ck") == []
    if (tmp / "out").exists():
        assert _files_holding_the_secret(tmp / "out") == []
    tables = server.psql(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'",
        database,
    ).split()
    assert "outcomes" in tables
    for table in tables:
        assert _leaks(server.psql(f'SELECT t::text FROM "{table}" t', database)) == [], table


@pytest.mark.jvm_process
@pytest.mark.spark
@pytest.mark.slow
def test_stream_cli_keeps_the_password_secret(tmp_path: Path, server: Any) -> None:
    """`pipeline stream --sink postgresql`: the password reaches PostgreSQL and nothing else.

    The password comes from a password file, escapes and all: past that file's
    reading, a password from ``PGPASSWORD`` takes the same path (the unit tests
    above show which one wins), so one run covers both.
    """
    database = "case_pgpass"
    line = f"127.0.0.1:{server.port}:{database}:postgres:{_escape(SECRET)}"
    env = _pgpass(tmp_path / "pgpass", "# tickwheel's test", line)
    proc = _run_stream(fresh(tmp_path / "run"), server, database, env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    source = f"the password file {tmp_path / 'pgpass'}"
    assert f"(user postgres, password from {source})" in proc.stdout
    assert server.psql("SELECT count(*) FROM tickwheel_batches", database).strip() == "1"
    assert int(server.psql("SELECT count(*) FROM outcomes", database)) > 0
    _assert_secret_nowhere(tmp_path / "run", server, database, proc)


def test_a_wrong_password_fails_without_showing_it(
    server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Authentication fails with a SinkError naming the redacted URL and the server's
    cause; the password is not in it. No JVM: pg8000 connects."""
    wrong = f"{CORE}-wrong"
    url = f"jdbc:postgresql://127.0.0.1:{server.port}/postgres?user=postgres"
    monkeypatch.setenv("PGPASSWORD", wrong)
    sink = PostgresSink(url)
    assert "wrong" not in sink.describe()
    with pytest.raises(SinkError, match="password authentication failed") as failure:
        sink.is_committed(0)
    assert f"at {url} (user postgres, password from PGPASSWORD)" in str(failure.value)
    assert _leaks(str(failure.value), repr(failure.value)) == []
    assert wrong not in str(failure.value)
    in_url = PostgresSink(f"{url}&password={wrong}")
    with pytest.raises(SinkError, match="password authentication failed") as failure:
        in_url.committed_batches()
    assert wrong not in str(failure.value) and "password from the URL" in str(failure.value)
    monkeypatch.delenv("PGPASSWORD")
    monkeypatch.setenv("PGPASSFILE", str(Path(server.dir) / "no-such-file"))
    with pytest.raises(SinkError, match="asks for a password, and none was found"):
        PostgresSink(url).is_committed(0)


def test_an_unreachable_server_is_named() -> None:
    """Connection refused: a SinkError naming the URL and the host, no traceback of
    pg8000's; the URL's secrets redacted."""
    import socket

    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"jdbc:postgresql://127.0.0.1:{port}/db?user=u&password={CORE}&connectTimeout=5"
    with pytest.raises(SinkError, match=f"127.0.0.1:{port}: Connection refused") as failure:
        PostgresSink(url).is_committed(0)
    assert _leaks(str(failure.value)) == []


def test_the_sink_says_when_pg8000_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pg8000", None)
    monkeypatch.setitem(sys.modules, "pg8000.dbapi", None)
    with pytest.raises(SinkError, match=r"needs pg8000: pip install 'tickwheel\[spark\]'"):
        PostgresSink("jdbc:postgresql://127.0.0.1:5432/db?user=u", None)


def test_the_commits_connection_follows_the_url() -> None:
    """pgjdbc's URL read for pg8000: every host in order, the database, the
    schema and the SSL mode as pgjdbc reads them; what pg8000 cannot honour refused."""
    import ssl

    from tickwheel.pipeline.sinks.postgres import _pg_ssl_context, _pg_target

    target = _pg_target(
        "jdbc:postgresql://h1,h2:5433,[::1]:5434/shop?user=u&currentSchema=s1"
        "&ApplicationName=tw&connectTimeout=0&socketTimeout=30&reWriteBatchedInserts=true"
    )
    assert target.hosts == (("h1", 5432), ("h2", 5433), ("::1", 5434))
    assert target.database == "shop"
    assert dict(target.startup) == {"search_path": "s1", "application_name": "tw"}
    assert (target.connect_timeout, target.socket_timeout) == (None, 30.0)
    assert _pg_target("jdbc:postgresql:shop").hosts == (("localhost", 5432),)
    assert _pg_target("jdbc:postgresql:/").database is None  # the server's default: the user

    def context(query: str) -> Any:
        return _pg_ssl_context(_pg_target(f"{URL}?{query}"), None)

    assert context("user=u") is None  # pgjdbc's default, prefer: SSL if offered
    assert context("sslmode=disable") is False
    assert context("ssl=false") is None
    required = context("sslmode=require")
    assert (required.verify_mode, required.check_hostname) == (ssl.CERT_NONE, False)
    for query in ("ssl=true", "ssl", "sslmode=verify-full"):
        full = context(query)
        assert (full.verify_mode, full.check_hostname) == (ssl.CERT_REQUIRED, True), query
    verify_ca = context("sslmode=verify-ca")
    assert (verify_ca.verify_mode, verify_ca.check_hostname) == (ssl.CERT_REQUIRED, False)
    trusting = context("ssl=true&sslfactory=org.postgresql.ssl.NonValidatingFactory")
    assert trusting.verify_mode == ssl.CERT_NONE
    for query in ("sslfactory=my.Factory", "sslhostnameverifier=x", "gssEncMode=require"):
        with pytest.raises(SinkError, match="cannot honour"):
            _pg_target(f"{URL}?{query}")
    with pytest.raises(SinkError, match="sslmode=bogus"):
        _pg_target(f"{URL}?sslmode=bogus")

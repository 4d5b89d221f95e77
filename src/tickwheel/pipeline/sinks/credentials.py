"""The PostgreSQL sink's URL, user and password, found as libpq finds them, and
URLs shown with their secrets redacted.

The password comes from where PostgreSQL users keep it, in libpq's order: the
URL (discouraged: a command line is visible to every user through ``ps``),
``PGPASSWORD``, then the password file (``PGPASSFILE``, else ``~/.pgpass``,
read with libpq's rules). The user comes from the URL, ``PGUSER`` or the login
name; without a URL, the server from ``PGHOST``/``PGPORT``/``PGDATABASE``.
Importing this module imports neither pyspark nor pg8000.
"""

from __future__ import annotations

import os
import re
import stat
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import unquote

from .base import SinkError

if TYPE_CHECKING:
    pass


__all__ = [
    "PG_PREFIX",
    "SECRET_PARAM",
    "PasswordFileWarning",
    "PostgresCredentials",
    "host_port",
    "pgpass_password",
    "postgres_credentials",
    "redact_url",
    "split_pg_url",
]

#: URL parameters whose value is a secret: redacted, and never left in a URL.
SECRET_PARAM = re.compile(r"(?i)pass|secret|token")
_REDACTED = "***"
PG_PREFIX = "jdbc:postgresql:"


class PasswordFileWarning(UserWarning):
    """A password file was ignored because it is not safe (libpq's rule)."""


def redact_url(url: str) -> str:
    """``url`` with its secrets replaced by ``***``. O(len(url)).

    The password of a ``user:password@host`` authority, and the value of every
    query parameter whose name holds ``pass``, ``secret`` or ``token``
    (``password``, ``sslpassword``, ...), whatever their case.
    """
    head, sep, query = url.partition("?")
    head = re.sub(r"(//[^/?#@:]*:)[^/?#]*@", rf"\g<1>{_REDACTED}@", head)
    if not sep:
        return head
    params = [
        f"{name}={_REDACTED}" if SECRET_PARAM.search(name) else f"{name}{eq}{value}"
        for name, eq, value in (p.partition("=") for p in query.split("&"))
    ]
    return f"{head}?{'&'.join(params)}"


@dataclass(frozen=True)
class PostgresCredentials:
    """Where and as whom the PostgreSQL sink connects, and with which password.

    ``url`` holds no secret (safe to show); ``properties`` are the secrets the
    URL held (``password``, ``sslpassword``, ...) plus ``user`` and the
    resolved ``password``, handed to pgjdbc as connection properties (Spark's
    JDBC reader and writer) and to pg8000 as ``connect()`` parameters (the
    sink's DDL and commit). Their repr is hidden. ``source`` says where the
    password came from.
    """

    url: str
    user: str
    source: str
    properties: Mapping[str, str] = field(repr=False)

    def describe(self) -> str:
        """``URL (user U, password from SOURCE)``, with nothing secret in it. O(len(url))."""
        return f"{redact_url(self.url)} (user {self.user}, password {self.source})"


def postgres_credentials(
    url: str | None, environ: Mapping[str, str] | None = None
) -> PostgresCredentials:
    """Resolve the PostgreSQL sink's URL, user and password as libpq does. O(password file).

    ``url`` is pgjdbc's (``jdbc:postgresql://HOST:PORT/DB?user=U``), or None to
    build it from ``PGHOST`` (default localhost), ``PGPORT`` (5432) and
    ``PGDATABASE`` (default: the user). The user: the URL's, else ``PGUSER``,
    else the login name. The password: the URL's (``password=`` or
    ``user:password@``), else ``PGPASSWORD`` (if not empty), else the password
    file's first matching line (:func:`pgpass_password`), else none. The
    secrets are taken out of the URL. Raises :class:`SinkError` naming the
    problem, with the URL redacted.
    """
    env = os.environ if environ is None else environ
    if url is None:
        url = _url_from_environment(env)
    if not url.startswith(PG_PREFIX):
        raise SinkError(
            "a PostgreSQL sink URL looks like "
            f"jdbc:postgresql://127.0.0.1:5432/db?user=me, got {redact_url(url)!r}"
        )
    base, host, port, database, params = split_pg_url(url)
    secrets = {k: v for k, v in params.items() if SECRET_PARAM.search(k)}
    user = params.get("user") or env.get("PGUSER") or _login_name()
    password, source = secrets.pop("password", None), "from the URL"
    if not password:
        password, source = env.get("PGPASSWORD") or None, "from PGPASSWORD"
    if not password:
        password, path = pgpass_password(host, port, database or user, user, env)
        source = f"from the password file {path}" if password else "none"
    properties = {**secrets, "user": user}
    if password:
        properties["password"] = password
    return PostgresCredentials(base, user, source, properties)


def _url_from_environment(env: Mapping[str, str]) -> str:
    if not any(env.get(name) for name in ("PGHOST", "PGPORT", "PGDATABASE")):
        raise SinkError(
            "the postgresql sink needs --jdbc-url jdbc:postgresql://HOST:PORT/DB?user=U, "
            "or PGHOST / PGPORT / PGDATABASE in the environment"
        )
    host = env.get("PGHOST") or "localhost"
    if host.startswith("/"):
        raise SinkError(f"PGHOST={host} is a socket directory; pgjdbc connects over TCP only")
    database = env.get("PGDATABASE") or env.get("PGUSER") or _login_name()
    return f"{PG_PREFIX}//{host}:{env.get('PGPORT') or 5432}/{database}"


def split_pg_url(url: str) -> tuple[str, str, str, str | None, dict[str, str]]:
    """(URL without user:password@ or secret parameters, first host, port, database, params).

    pgjdbc's forms: ``jdbc:postgresql:DB``, ``jdbc:postgresql:/``, and
    ``jdbc:postgresql://HOST[:PORT][,HOST[:PORT]...]/[DB]``, then ``?k=v&...``
    (values URL-encoded). libpq's ``user:password@`` authority is accepted too.
    """
    rest, _, query = url[len(PG_PREFIX) :].partition("?")
    params: dict[str, str] = {}
    kept = []
    for part in filter(None, query.split("&")):
        name, _, value = part.partition("=")
        params[unquote(name)] = unquote(value)
        if not SECRET_PARAM.search(unquote(name)):
            kept.append(part)
    host, port, database = "localhost", "5432", rest.strip("/") or None
    if rest.startswith("//"):
        authority, _, path = rest[2:].partition("/")
        userinfo, _, hosts = authority.rpartition("@")
        if userinfo:
            name, has_password, secret = userinfo.partition(":")
            params.setdefault("user", unquote(name))
            if has_password:
                params.setdefault("password", unquote(secret))
        host, port = host_port(hosts.split(",")[0])
        database = unquote(path) or None
        rest = f"//{hosts}/{path}"
    base = PG_PREFIX + rest + ("?" + "&".join(kept) if kept else "")
    return base, host, port, database, params


def host_port(text: str) -> tuple[str, str]:
    """(host, port) of ``HOST[:PORT]`` or ``[IPv6][:PORT]``; the port defaults to 5432. O(len)."""
    if text.startswith("["):  # [IPv6]:port
        address, _, port = text[1:].partition("]")
        return address, port.lstrip(":") or "5432"
    host, _, port = text.partition(":")
    return host or "localhost", port or "5432"


def _login_name() -> str:
    import pwd

    return pwd.getpwuid(os.geteuid()).pw_name


def pgpass_password(
    host: str, port: str, database: str, user: str, environ: Mapping[str, str] | None = None
) -> tuple[str | None, str]:
    """The password file's password for this connection, as libpq reads it: (password, path).

    The file is ``PGPASSFILE``, else ``~/.pgpass``. Each line is
    ``hostname:port:database:username:password``; ``#`` starts a comment line;
    a field of ``*`` matches anything; ``\\:`` and ``\\\\`` are a literal colon
    and backslash; the first matching line wins, and its password ends at the
    next unescaped colon. Like libpq, a missing file is no password, and a file
    that is not a plain file or that its group or others may access at all is
    ignored with a :class:`PasswordFileWarning`. O(file size).
    """
    env = os.environ if environ is None else environ
    path = env.get("PGPASSFILE") or os.path.join(_home(env), ".pgpass")
    try:
        info = os.stat(path)
    except OSError:
        return None, path
    if not stat.S_ISREG(info.st_mode):
        warnings.warn(f'password file "{path}" is not a plain file', PasswordFileWarning, 2)
        return None, path
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        warnings.warn(
            f'password file "{path}" has group or world access; permissions should be '
            "u=rw (0600) or less: ignored",
            PasswordFileWarning,
            2,
        )
        return None, path
    try:
        with open(path, encoding="utf-8", errors="replace", newline="") as fh:
            lines = fh.read().split("\n")
    except OSError:
        return None, path
    for line in lines:
        password = _pgpass_line(line.rstrip("\r"), (host, port, database, user))
        if password is not None:
            return password, path
    return None, path


def _home(env: Mapping[str, str]) -> str:
    home = env.get("HOME")
    if home:
        return home
    import pwd

    return pwd.getpwuid(os.geteuid()).pw_dir


def _pgpass_line(line: str, wanted: tuple[str, str, str, str]) -> str | None:
    """The line's password if its four fields match ``wanted`` (libpq's passwordFromFile)."""
    if not line or line.startswith("#"):
        return None
    i = 0
    for token in wanted:
        after = _pgpass_field(line, i, token)
        if after is None:
            return None
        i = after
    out = []
    while i < len(line) and line[i] != ":":
        if line[i] == "\\" and i + 1 < len(line):
            i += 1
        out.append(line[i])
        i += 1
    return "".join(out)


def _pgpass_field(line: str, at: int, token: str) -> int | None:
    """Where the next field starts, if the field at ``at`` matches ``token`` (libpq's
    pwdfMatchesString: ``*`` alone matches anything, a backslash escapes one character)."""
    if line.startswith("*:", at):
        return at + 2
    matched = 0
    while at < len(line):
        escaped = line[at] == "\\"
        if escaped:
            at += 1
            if at == len(line):
                return None
        if line[at] == ":" and not escaped and matched == len(token):
            return at + 1
        if matched == len(token) or line[at] != token[matched]:
            return None
        at += 1
        matched += 1
    return None

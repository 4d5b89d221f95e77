"""Output sinks for the incremental pipeline: one interface, idempotent per batch id.

Every sink stores the tables of one micro-batch (``outcomes``, ``unmatched``,
``rejected``, ``late``) under that batch's id, in two steps:

``stage(batch_id, tables)``
    writes the rows where no reader looks (a staging directory or staging tables).
    Staging again replaces what an earlier, crashed attempt staged.
``commit(batch_id)``
    makes the staged rows visible, exactly once. A batch id that is already
    committed is a no-op, so a micro-batch replayed after a crash never adds a
    second copy of its rows.

Sinks:

* :class:`ParquetSink` (default, embedded): ``OUT/<table>/batch_id=N/part-*.parquet``,
  written in place (after deleting what a failed attempt of the same batch left
  there); the commit is one new file, ``OUT/_batches/N.json``, and readers take
  only the batches it names. ``OUT`` may be a local path or any URI Spark writes.
* :class:`SqliteSink`: Spark JDBC with Debian's xerial jar into staging tables,
  then one SQLite transaction copies them into the real tables and inserts the
  ``tickwheel_batches`` row.
* :class:`PostgresSink`: Spark JDBC with Debian's pgjdbc jar into staging tables,
  then ONE PostgreSQL transaction (through pg8000, in the Python process that runs
  the micro-batch: the driver on a classic session, the Python process beside the
  server under Spark Connect) checks ``tickwheel_batches``, copies the batch's rows
  into the real tables and inserts the ``tickwheel_batches(batch_id, ...)`` row:
  results and offsets in one transaction, so a replayed batch is a no-op.

Spark's JDBC writer cannot create tables in SQLite, and reads SQLite's BIGINT
back as a decimal; the JDBC sinks therefore create every table themselves from
the DataFrame's schema and read back with an explicit ``customSchema``.

Credentials (:func:`postgres_credentials`): the PostgreSQL password comes from
where PostgreSQL users keep it, in libpq's order: the URL (discouraged: a
command line is visible to every user through ``ps``), ``PGPASSWORD``, then the
password file (``PGPASSFILE``, else ``~/.pgpass``, read with libpq's rules). The
user comes from the URL, ``PGUSER`` or the login name; without a URL, the server
from ``PGHOST``/``PGPORT``/``PGDATABASE``. The password is handed to pg8000 as a
``connect()`` parameter (the DDL and the commit) and to pgjdbc as a connection
property (Spark's JDBC reader and writer, as their ``password`` option, which
Spark redacts), never inside a URL, and :meth:`BatchSink.describe` and every
error message show URLs through :func:`redact_url`. The password file is read
where the sink is built: the executors receive the password with the JDBC
options, so a cluster's workers need no password file of their own.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sqlite3
import stat
import time
import warnings
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import unquote

from .storage import Storage, StorageError, absolute, create_json, join, storage_for

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = [
    "BATCH_ID",
    "BatchSink",
    "FunctionSink",
    "ParquetSink",
    "PasswordFileWarning",
    "PostgresCredentials",
    "PostgresSink",
    "SinkError",
    "SinkFunction",
    "SqliteSink",
    "as_sink",
    "jdbc_jars",
    "make_sink",
    "pgpass_password",
    "postgres_credentials",
    "redact_url",
    "spark_jdbc_conf",
]

#: The column every sink adds to every table: the micro-batch id.
BATCH_ID = "batch_id"

_JAR_DIR = "/usr/share/java"
_SQLITE_JARS = ("sqlite-jdbc.jar", "xerial-sqlite-jdbc.jar")
_POSTGRES_JARS = ("postgresql.jar",)
_JNI_DIRS = ("/usr/lib/x86_64-linux-gnu/jni", "/usr/lib/aarch64-linux-gnu/jni", "/usr/lib/jni")


class SinkError(RuntimeError):
    """A sink cannot be used (missing driver jar, bad URL, unreachable database)."""


def _find_jar(names: Sequence[str], package: str) -> str | None:
    for name in names:
        path = os.path.join(_JAR_DIR, name)
        if os.path.exists(path):
            return path
    return None


def jdbc_jars() -> list[str]:
    """Return the Debian JDBC driver jars that are installed (SQLite, PostgreSQL). O(1)."""
    jars = []
    for names, package in (
        (_SQLITE_JARS, "libxerial-sqlite-jdbc-java"),
        (_POSTGRES_JARS, "libpostgresql-jdbc-java"),
    ):
        jar = _find_jar(names, package)
        if jar is not None:
            jars.append(jar)
    return jars


def spark_jdbc_conf() -> dict[str, str]:
    """Spark settings that put the installed JDBC jars on the driver and executors.

    They must be given before the SparkSession starts (``builder.config(k, v)``).
    The driver class path matters: Spark's JDBC reader and writer connect from
    the driver JVM too (to resolve a table's schema, to check that it exists),
    and the class archive records it (:func:`~.spark.class_archive.session_conf`);
    the sinks' own DDL and commits do not use the JVM. The SQLite jar's native
    half lives in Debian's JNI directory, which is added to
    ``java.library.path``. O(1).
    """
    jars = jdbc_jars()
    if not jars:
        return {}
    jni = [d for d in _JNI_DIRS if os.path.isdir(d)]
    conf = {
        "spark.jars": ",".join(jars),
        "spark.driver.extraClassPath": os.pathsep.join(jars),
        "spark.executor.extraClassPath": os.pathsep.join(jars),
    }
    if jni:
        lib = os.pathsep.join(jni)
        conf["spark.driver.extraLibraryPath"] = lib
        conf["spark.executor.extraLibraryPath"] = lib
    return conf


class BatchSink(Protocol):
    """Where the pipeline's per-batch tables go; idempotent per batch id."""

    name: str

    def stage(
        self,
        batch_id: int,
        tables: Mapping[str, DataFrame],
        on_table: Callable[[str], None] | None = None,
        empty: Collection[str] = (),
        small: bool = False,
    ) -> None:
        """Write the batch's rows out of readers' sight, replacing an earlier attempt.

        ``on_table(name)`` is called after each table is written (progress, tests).
        ``empty`` names tables known to have no rows: the sink writes none of
        them (no Spark job), and still has each table once it has been declared.
        ``small`` says every table is small enough to collect to the driver,
        which a sink may do rather than run Spark's writer.
        """

    def commit(self, batch_id: int) -> bool:
        """Make the staged batch visible exactly once; False when it already was."""

    def is_committed(self, batch_id: int) -> bool:
        """True when ``batch_id`` is visible in the sink."""

    def read_table(self, spark: SparkSession, table: str) -> DataFrame | None:
        """Return all committed rows of ``table`` (with ``batch_id``), or None if none."""

    def describe(self) -> str:
        """A short human description (for progress messages and summaries)."""


#: A user's sink, Spark's way: ``fn(tables, batch_id)`` as ``foreachBatch`` calls it.
SinkFunction = Callable[[Mapping[str, "DataFrame"], int], object]


class FunctionSink:
    """A function of the user's as the stream's sink, with ``foreachBatch``'s contract.

    ``fn(tables, batch_id)`` gets the micro-batch's ``outcomes``,
    ``unmatched``, ``rejected`` and ``late`` DataFrames. It is called before
    the checkpoint commits the batch, so after a crash it may be called again
    with the same batch id, and then gets the same rows: the step recomputes
    them from the same records and the same carried state. Making the writes
    idempotent by batch id (a table keyed by it, Delta's
    ``txnAppId``/``txnVersion``, a MERGE), or leaving the duplicates to the
    consumer (a Kafka topic), is the function's part, as with Spark's own
    ``foreachBatch``. The built-in sinks keep their own exactly-once commit.
    """

    name = "function"

    def __init__(self, fn: SinkFunction) -> None:
        """Call ``fn`` for each micro-batch. O(1)."""
        if not callable(fn):
            raise SinkError(f"a sink function must be callable, got {fn!r}")
        self.fn = fn

    def stage(
        self,
        batch_id: int,
        tables: Mapping[str, DataFrame],
        on_table: Callable[[str], None] | None = None,
        empty: Collection[str] = (),
        small: bool = False,
    ) -> None:
        """Call the function with the batch's tables (every one, empty or not)."""
        self.fn(dict(tables), batch_id)
        if on_table is not None:
            for name in sorted(tables):
                on_table(name)

    def commit(self, batch_id: int) -> bool:
        """Nothing to do: the function wrote what it wrote. O(1)."""
        return True

    def is_committed(self, batch_id: int) -> bool:
        """False: a replayed batch is handed to the function again. O(1)."""
        return False

    def read_table(self, spark: SparkSession, table: str) -> DataFrame | None:
        """None: the rows are where the function put them. O(1)."""
        return None

    def describe(self) -> str:
        """``function:<qualified name>``."""
        return f"function:{getattr(self.fn, '__qualname__', repr(self.fn))}"


def as_sink(sink: BatchSink | SinkFunction) -> BatchSink:
    """``sink`` if it is a :class:`BatchSink`, else a :class:`FunctionSink` of it. O(1)."""
    if all(hasattr(sink, name) for name in ("stage", "commit", "is_committed")):
        return sink  # type: ignore[return-value]
    return FunctionSink(sink)  # type: ignore[arg-type]


def _with_batch_id(df: DataFrame, batch_id: int) -> DataFrame:
    from pyspark.sql import functions as F

    return df.withColumn(BATCH_ID, F.lit(batch_id).cast("long"))


def _write_empty_parquet(storage: Storage, directory: str, schema: StructType) -> None:
    """A new table directory holding one Parquet file of ``schema`` and no rows. O(columns)."""
    import pyarrow as pa  # type: ignore[import-untyped]
    from pyspark.sql.pandas.types import to_arrow_schema

    from .spark.frames import write_arrow_parquet

    empty = pa.Table.from_batches([], schema=to_arrow_schema(schema))
    write_arrow_parquet(empty, directory, storage)


class ParquetSink:
    """Parquet directory sink (the default): each batch's tables in place, then a marker.

    Layout: ``OUT/<table>/batch_id=N/`` for the rows of batch ``N``, and
    ``OUT/_batches/N.json``, the commit marker. A batch's rows count once its
    marker exists: :meth:`read_table` takes only those batches, and a replay
    of an uncommitted batch first deletes what the failed attempt wrote. No
    directory is renamed and no file overwritten, so ``OUT`` may be a local
    path or any URI Spark writes (through ``spark``'s Hadoop file systems,
    on a classic session). ``commit`` costs one new small file. A reader that
    lists ``OUT/<table>`` itself should keep the ``batch_id`` values that have
    a marker.
    """

    name = "parquet"

    def __init__(self, output: str, spark: SparkSession | None = None) -> None:
        """Use ``output`` (a directory or URI) as the sink's root."""
        self.root = absolute(output)
        try:
            self.storage = storage_for(self.root, spark)
        except StorageError as exc:
            raise SinkError(f"the parquet sink: {exc}") from None
        self._markers = join(self.root, "_batches")
        self._staged: dict[int, list[str]] = {}

    def describe(self) -> str:
        """Return ``parquet:<dir>``."""
        return f"parquet:{self.root}"

    def __getstate__(self) -> dict[str, Any]:
        """Shipped to Spark Connect's foreachBatch process, which has only local paths."""
        return {**self.__dict__, "_staged": {}}

    def _marker(self, batch_id: int) -> str:
        return join(self._markers, f"{batch_id}.json")

    def _batch_dir(self, table: str, batch_id: int) -> str:
        return join(self.root, table, f"{BATCH_ID}={batch_id}")

    def stage(
        self,
        batch_id: int,
        tables: Mapping[str, DataFrame],
        on_table: Callable[[str], None] | None = None,
        empty: Collection[str] = (),
        small: bool = False,
    ) -> None:
        """Write each table in ``<table>/batch_id=N/``, deleting a crashed attempt's first.

        A committed batch is left as it is (its rows are never written twice).
        The tables are written by concurrent Spark jobs (one thread each): a
        micro-batch's tables are small, so their fixed per-job costs dominate and
        overlap. With ``small``, each is collected and written by the driver
        instead (:func:`~.spark.frames.write_parquet`), which skips Hadoop's
        commit protocol. ``on_table`` is called as each one finishes. A table
        in ``empty`` gets an empty Parquet file of its schema, written here
        without a Spark job.
        """
        from concurrent.futures import ThreadPoolExecutor, as_completed

        from .spark.frames import write_parquet

        if self.is_committed(batch_id):
            return
        names = sorted(tables)
        for name in names:  # what a failed attempt of this uncommitted batch left
            self.storage.delete(self._batch_dir(name, batch_id))
        for name in empty:  # no Spark job: an empty file of the table's schema
            _write_empty_parquet(self.storage, self._batch_dir(name, batch_id),
                                 tables[name].schema)  # fmt: skip
            if on_table is not None:
                on_table(name)
        tables = {name: df for name, df in tables.items() if name not in empty}

        def write(table: str, df: DataFrame) -> str:
            write_parquet(df, self._batch_dir(table, batch_id), in_driver=small,
                          storage=self.storage)  # fmt: skip
            return table

        with ThreadPoolExecutor(max_workers=max(1, len(tables))) as pool:
            futures = [pool.submit(write, table, df) for table, df in tables.items()]
            for future in as_completed(futures):
                table = future.result()
                if on_table is not None:
                    on_table(table)
        self._staged[batch_id] = names

    def commit(self, batch_id: int) -> bool:
        """Create the marker ``_batches/N.json`` of the tables :meth:`stage` wrote; False
        when the batch was committed already."""
        if self.is_committed(batch_id):
            return False
        tables = self._staged.pop(batch_id, None)
        if tables is None:
            raise SinkError(f"batch {batch_id} was not staged in {self.root}")
        try:
            marker = {"batch_id": batch_id, "tables": tables, "committed_at": time.time()}
            create_json(self.storage, self._marker(batch_id), marker)
        except FileExistsError:
            return False
        return True

    def is_committed(self, batch_id: int) -> bool:
        """True when the batch's marker exists. O(1)."""
        return self.storage.exists(self._marker(batch_id))

    def committed_batches(self) -> list[int]:
        """Return the committed batch ids in order. O(batches)."""
        ids = []
        for name in self.storage.list_names(self._markers):
            if name.endswith(".json") and name[:-5].isdigit():
                ids.append(int(name[:-5]))
        return sorted(ids)

    def read_table(self, spark: SparkSession, table: str) -> DataFrame | None:
        """Read the committed rows of ``table``, ``batch_id`` as a column."""
        from pyspark.sql import functions as F

        path = join(self.root, table)
        if not any(n.startswith(f"{BATCH_ID}=") for n in self.storage.list_names(path)):
            return None
        committed = self.committed_batches()
        df = spark.read.option("basePath", path).parquet(path)
        df = df.withColumn(BATCH_ID, F.col(BATCH_ID).cast("long"))
        return df.where(F.col(BATCH_ID).isin(committed))


# --------------------------------------------------------------------------- JDBC


def _sql_type(dtype: Any, dialect: str) -> str:
    from pyspark.sql import types as T

    if isinstance(dtype, T.LongType):
        return "BIGINT"
    if isinstance(dtype, (T.IntegerType, T.ShortType, T.ByteType)):
        return "INTEGER"
    if isinstance(dtype, (T.DoubleType, T.FloatType)):
        return "DOUBLE PRECISION" if dialect == "postgresql" else "REAL"
    if isinstance(dtype, T.BooleanType):
        return "BOOLEAN" if dialect == "postgresql" else "INTEGER"
    if isinstance(dtype, T.TimestampType):
        return "TIMESTAMPTZ" if dialect == "postgresql" else "TEXT"
    if isinstance(dtype, T.StringType):
        return "TEXT"
    if isinstance(dtype, T.BinaryType):
        return "BYTEA" if dialect == "postgresql" else "BLOB"
    if isinstance(dtype, T.DecimalType):
        return f"NUMERIC({dtype.precision},{dtype.scale})"
    raise SinkError(f"the JDBC sinks cannot store a column of type {dtype.simpleString()}")


def _quote(name: str) -> str:
    if not name.replace("_", "").isalnum():
        raise SinkError(f"unsafe SQL identifier {name!r}")
    return f'"{name}"'


def _create_table_sql(name: str, schema: StructType, dialect: str) -> str:
    cols = [f"{_quote(f.name)} {_sql_type(f.dataType, dialect)}" for f in schema.fields]
    cols.append(f"{_quote(BATCH_ID)} BIGINT NOT NULL")
    return f"CREATE TABLE IF NOT EXISTS {_quote(name)} ({', '.join(cols)})"


def _custom_schema(schema: StructType) -> str:
    parts = [f"{f.name} {f.dataType.simpleString()}" for f in schema.fields]
    parts.append(f"{BATCH_ID} bigint")
    return ", ".join(parts)


# --------------------------------------------------------------------------- credentials

#: URL parameters whose value is a secret: redacted, and never left in a URL.
_SECRET_PARAM = re.compile(r"(?i)pass|secret|token")
_REDACTED = "***"
_PG_PREFIX = "jdbc:postgresql:"


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
        f"{name}={_REDACTED}" if _SECRET_PARAM.search(name) else f"{name}{eq}{value}"
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
    if not url.startswith(_PG_PREFIX):
        raise SinkError(
            "a PostgreSQL sink URL looks like "
            f"jdbc:postgresql://127.0.0.1:5432/db?user=me, got {redact_url(url)!r}"
        )
    base, host, port, database, params = _split_pg_url(url)
    secrets = {k: v for k, v in params.items() if _SECRET_PARAM.search(k)}
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
    return f"{_PG_PREFIX}//{host}:{env.get('PGPORT') or 5432}/{database}"


def _split_pg_url(url: str) -> tuple[str, str, str, str | None, dict[str, str]]:
    """(URL without user:password@ or secret parameters, first host, port, database, params).

    pgjdbc's forms: ``jdbc:postgresql:DB``, ``jdbc:postgresql:/``, and
    ``jdbc:postgresql://HOST[:PORT][,HOST[:PORT]...]/[DB]``, then ``?k=v&...``
    (values URL-encoded). libpq's ``user:password@`` authority is accepted too.
    """
    rest, _, query = url[len(_PG_PREFIX) :].partition("?")
    params: dict[str, str] = {}
    kept = []
    for part in filter(None, query.split("&")):
        name, _, value = part.partition("=")
        params[unquote(name)] = unquote(value)
        if not _SECRET_PARAM.search(unquote(name)):
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
        host, port = _host_port(hosts.split(",")[0])
        database = unquote(path) or None
        rest = f"//{hosts}/{path}"
    base = _PG_PREFIX + rest + ("?" + "&".join(kept) if kept else "")
    return base, host, port, database, params


def _host_port(text: str) -> tuple[str, str]:
    if text.startswith("["):  # [IPv6]:port
        address, _, port = text[1:].partition("]")
        return address, port.lstrip(":") or "5432"
    host, _, port = text.partition(":")
    return host or "localhost", port or "5432"


# --------------------------------------------------------------------------- pg8000

_PG8000_MISSING = "the PostgreSQL sink needs pg8000: pip install 'tickwheel[spark]'"
_SSL_MODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
#: pgjdbc's SSL parameters that the commit's connection honours (or may ignore, the
#: last one); any other ``ssl*`` one, and ``gssEncMode=require``, is refused, so that
#: the commit's connection is never less protected than the URL asks.
_SSL_PARAMS = frozenset(
    {"ssl", "sslmode", "sslrootcert", "sslcert", "sslkey", "sslfactory", "sslresponsetimeout"}
)
_NON_VALIDATING = "org.postgresql.ssl.NonValidatingFactory"


def _pg8000_dbapi() -> Any:
    """The ``pg8000.dbapi`` module, or a :class:`SinkError` saying how to install it. O(1)."""
    try:
        import pg8000.dbapi  # type: ignore[import-untyped]
    except ImportError as exc:
        raise SinkError(_PG8000_MISSING) from exc
    return pg8000.dbapi


@dataclass(frozen=True)
class _PgTarget:
    """What pg8000 needs from a pgjdbc URL (no secret): its hosts in pgjdbc's order,
    the database, the timeouts in seconds (None: none), the SSL mode and files,
    and the startup parameters (``search_path``, ``options``, ``application_name``)."""

    hosts: tuple[tuple[str, int], ...]
    database: str | None
    connect_timeout: float | None
    socket_timeout: float | None
    ssl_mode: str
    ssl_files: Mapping[str, str]
    startup: Mapping[str, str]


def _pg_target(url: str) -> _PgTarget:
    """Read a secret-free pgjdbc URL as pg8000 will use it. O(len(url)).

    The parameters that change where, how securely or in which schema the
    statements run are mapped as pgjdbc reads them: ``sslmode`` (else ``ssl``:
    ``verify-full`` when true, else ``prefer``), ``sslrootcert``, ``sslcert``,
    ``sslkey``, ``sslfactory=org.postgresql.ssl.NonValidatingFactory``,
    ``connectTimeout`` (default 10 s, 0 for none), ``socketTimeout`` (default
    none), ``currentSchema``, ``options`` and ``ApplicationName``; an SSL
    parameter pg8000 cannot honour is a :class:`SinkError`. The others tune
    pgjdbc (Spark's JDBC writer and reader) and are ignored here.
    """
    _, _, _, database, raw = _split_pg_url(url)
    params = {name.lower(): value for name, value in raw.items()}
    rest = url[len(_PG_PREFIX) :].partition("?")[0]
    hosts = ["localhost:5432"]
    if rest.startswith("//"):
        hosts = rest[2:].partition("/")[0].rpartition("@")[2].split(",")
    targets = []
    for text in hosts:
        host, port = _host_port(text)
        if not port.isdigit():
            raise SinkError(f"bad port {port!r} in the PostgreSQL URL {redact_url(url)!r}")
        targets.append((host, int(port)))
    unsupported = sorted(
        name
        for name in params
        if name.startswith("ssl") and name not in _SSL_PARAMS and not _SECRET_PARAM.search(name)
    )
    factory = params.get("sslfactory")
    if factory is not None and factory != _NON_VALIDATING:
        unsupported.append(f"sslfactory={factory}")
    if params.get("gssencmode", "").lower() == "require":
        unsupported.append("gssEncMode=require")
    if unsupported:
        raise SinkError(
            f"the PostgreSQL sink's commit connection (pg8000) cannot honour "
            f"{', '.join(unsupported)} in {redact_url(url)!r}"
        )
    mode = params.get("sslmode")
    if mode is None:
        ssl = params.get("ssl")
        mode = "verify-full" if ssl is not None and ssl.lower() in ("", "true") else "prefer"
    if mode not in _SSL_MODES:
        raise SinkError(f"unknown sslmode={mode} in the PostgreSQL URL {redact_url(url)!r}")
    if factory == _NON_VALIDATING and mode in ("verify-ca", "verify-full"):
        mode = "require"  # encrypted, the certificate not checked (pgjdbc's NonValidatingFactory)
    if "sslcert" in params and mode in ("disable", "allow", "prefer"):
        raise SinkError(
            f"sslcert needs sslmode=require, verify-ca or verify-full: {redact_url(url)!r}"
        )
    startup = {
        name: params[key]
        for name, key in (
            ("search_path", "currentschema"),
            ("options", "options"),
            ("application_name", "applicationname"),
        )
        if params.get(key)
    }
    return _PgTarget(
        hosts=tuple(targets),
        database=database,
        connect_timeout=_seconds(params.get("connecttimeout", "10"), "connectTimeout", url),
        socket_timeout=_seconds(params.get("sockettimeout", "0"), "socketTimeout", url),
        ssl_mode=mode,
        ssl_files={k: params[k] for k in ("sslrootcert", "sslcert", "sslkey") if k in params},
        startup=startup,
    )


def _seconds(text: str, name: str, url: str) -> float | None:
    try:
        seconds = float(text)
    except ValueError:
        raise SinkError(f"{name}={text} is not a number of seconds: {redact_url(url)!r}") from None
    return seconds if seconds > 0 else None


def _pg_ssl_context(target: _PgTarget, sslpassword: str | None) -> Any:
    """pg8000's ``ssl_context`` for ``target``: False (disable), None (try SSL
    without checking the certificate, else plain: allow and prefer) or an
    :class:`ssl.SSLContext` that requires SSL. ``verify-ca``/``verify-full``
    check the server's certificate against ``sslrootcert``, else
    ``~/.postgresql/root.crt`` (pgjdbc's default) when it exists, else the
    system's CAs; ``verify-full`` also checks its host name. O(certificate files).
    """
    import ssl

    mode = target.ssl_mode
    if mode == "disable":
        return False
    if mode in ("allow", "prefer"):
        return None
    context = ssl.create_default_context()
    if mode in ("verify-ca", "verify-full"):
        root = target.ssl_files.get("sslrootcert") or os.path.expanduser("~/.postgresql/root.crt")
        if "sslrootcert" in target.ssl_files or os.path.exists(root):
            context.load_verify_locations(cafile=root)
        context.check_hostname = mode == "verify-full"
    else:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if "sslcert" in target.ssl_files:
        context.load_cert_chain(
            target.ssl_files["sslcert"], target.ssl_files.get("sslkey"), password=sslpassword
        )
    return context


def _pg_socket(target: _PgTarget) -> tuple[Any, str]:
    """(a TCP socket, its host name) to the first of ``target``'s hosts that accepts,
    tried in order as pgjdbc does; the socket's timeout is then the socket timeout.
    Raises the last host's OSError, noted with its ``host:port``."""
    import socket

    failure: OSError | None = None
    for host, port in target.hosts:
        try:
            sock = socket.create_connection((host, port), timeout=target.connect_timeout)
        except OSError as exc:
            exc.add_note(f"{host}:{port}")
            failure = exc
            continue
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.settimeout(target.socket_timeout)
        return sock, host
    assert failure is not None
    raise failure


def _pg_failure(exc: BaseException, password: bool) -> str:
    """The cause of a failed connection in a few words (no secret is in any of them)."""
    details = exc.args[0] if exc.args and isinstance(exc.args[0], dict) else None
    if details is not None:  # a PostgreSQL error response: message and SQLSTATE
        return f"{details.get('M', 'error')} (SQLSTATE {details.get('C', '?')})"
    if not password and (isinstance(exc, AttributeError) or "password" in str(exc)):
        # pg8000 asked for one (md5, cleartext), or failed on the missing one (SCRAM)
        return (
            "the server asks for a password, and none was found "
            "(not in the URL, PGPASSWORD or the password file)"
        )
    text = (exc.strerror if isinstance(exc, OSError) else None) or str(exc)
    where = "".join(f"{note}: " for note in getattr(exc, "__notes__", ()))
    return f"{where}{text or type(exc).__name__}"


def _close_quietly(conn: Any) -> None:
    with contextlib.suppress(Exception):
        conn.close()


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


_BATCHES_TABLE = "tickwheel_batches"
_SCHEMAS_TABLE = "tickwheel_schemas"


class _JdbcSink:
    """Shared logic of the SQLite and PostgreSQL sinks (staging tables + one transaction)."""

    name = "jdbc"
    dialect = "?"
    driver_class = "?"

    def __init__(self, url: str, *, prefix: str = "") -> None:
        self.url = url
        self.prefix = prefix
        self._schemas: dict[str, StructType] = {}
        self._ready = False

    # dialect hooks -------------------------------------------------------------
    def _execute(self, statements: Sequence[str], *, transaction: bool) -> None:
        raise NotImplementedError

    def _query(self, sql: str) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def _jdbc_options(self) -> dict[str, str]:
        return {"url": self.url, "driver": self.driver_class}

    def _write_parallelism(self) -> int | None:
        return None

    # shared --------------------------------------------------------------------
    def describe(self) -> str:
        """Return ``<dialect>:<url>``, secrets redacted (:func:`redact_url`)."""
        return f"{self.name}:{redact_url(self.url)}"

    def _table(self, table: str) -> str:
        return f"{self.prefix}{table}"

    def _stage_table(self, table: str) -> str:
        return f"{self.prefix}stage_{table}"

    def _ensure_base(self) -> None:
        if self._ready:
            return
        self._execute(
            [
                f"CREATE TABLE IF NOT EXISTS {_quote(self._table(_BATCHES_TABLE))} ("
                "batch_id BIGINT PRIMARY KEY, committed_at DOUBLE PRECISION NOT NULL, "
                "row_counts TEXT NOT NULL)",
                f"CREATE TABLE IF NOT EXISTS {_quote(self._table(_SCHEMAS_TABLE))} ("
                "table_name TEXT PRIMARY KEY, spark_schema TEXT NOT NULL)",
            ],
            transaction=True,
        )
        self._ready = True

    def _ensure_table(self, table: str, schema: StructType) -> None:
        from pyspark.sql.types import StructType

        if table in self._schemas:
            return
        rows = self._query(
            f"SELECT spark_schema FROM {_quote(self._table(_SCHEMAS_TABLE))} "
            f"WHERE table_name = '{table}'"
        )
        if rows:
            stored = StructType.fromJson(json.loads(rows[0][0]))
            if [f.name for f in stored.fields] != [f.name for f in schema.fields]:
                raise SinkError(
                    f"table {self._table(table)!r} exists with columns "
                    f"{[f.name for f in stored.fields]}, the batch has "
                    f"{[f.name for f in schema.fields]}"
                )
            self._schemas[table] = stored
            return
        schema_json = json.dumps(schema.jsonValue()).replace("'", "''")
        self._execute(
            [
                _create_table_sql(self._table(table), schema, self.dialect),
                _create_table_sql(self._stage_table(table), schema, self.dialect),
                f"INSERT INTO {_quote(self._table(_SCHEMAS_TABLE))} (table_name, spark_schema) "
                f"VALUES ('{table}', '{schema_json}')",
            ],
            transaction=True,
        )
        self._schemas[table] = schema

    def _known_tables(self) -> list[str]:
        """Tables staged in this process, else every table the sink has created."""
        from pyspark.sql.types import StructType

        staged = getattr(self, "_staged_tables", None)
        if staged is not None:
            return list(staged)
        rows = self._query(
            f"SELECT table_name, spark_schema FROM {_quote(self._table(_SCHEMAS_TABLE))} "
            "ORDER BY table_name"
        )
        for name, schema in rows:
            self._schemas.setdefault(name, StructType.fromJson(json.loads(schema)))
        return [name for name, _ in rows]

    def _drop_staged(self, batch_id: int, tables: Sequence[str]) -> None:
        self._execute(
            [
                f"DELETE FROM {_quote(self._stage_table(t))} WHERE {BATCH_ID} = {int(batch_id)}"
                for t in tables
            ],
            transaction=True,
        )

    def stage(
        self,
        batch_id: int,
        tables: Mapping[str, DataFrame],
        on_table: Callable[[str], None] | None = None,
        empty: Collection[str] = (),
        small: bool = False,  # Spark's JDBC writer inserts from the executors either way
    ) -> None:
        """Write the batch's rows into staging tables through Spark's JDBC writer.

        A table in ``empty`` is created when missing, and gets no write job.
        """
        self._ensure_base()
        self._staged_tables = sorted(tables)
        for table, df in tables.items():
            self._ensure_table(table, df.schema)
            if table in empty:
                if on_table is not None:
                    on_table(table)
                continue
            stage = self._stage_table(table)
            self._execute(
                [f"DELETE FROM {_quote(stage)} WHERE {BATCH_ID} = {int(batch_id)}"],
                transaction=True,
            )
            out = _with_batch_id(df, batch_id)
            parallelism = self._write_parallelism()
            if parallelism is not None:
                out = out.coalesce(parallelism)
            writer = out.write.format("jdbc").mode("append").option("dbtable", stage)
            for key, value in self._jdbc_options().items():
                writer = writer.option(key, value)
            writer.option("batchsize", "10000").save()
            if on_table is not None:
                on_table(table)

    def commit(self, batch_id: int) -> bool:
        """Copy the staged rows and insert the ``tickwheel_batches`` row in ONE transaction."""
        self._ensure_base()
        tables = self._known_tables()
        if self.is_committed(batch_id):
            self._drop_staged(batch_id, tables)  # a replay's staged rows: not a second copy
            return False
        counts = {}
        for table in tables:
            rows = self._query(
                f"SELECT COUNT(*) FROM {_quote(self._stage_table(table))} "
                f"WHERE {BATCH_ID} = {int(batch_id)}"
            )
            counts[table] = int(rows[0][0])
        statements = []
        for table in tables:
            cols = ", ".join(_quote(f.name) for f in self._schemas[table].fields)
            cols += f", {_quote(BATCH_ID)}"
            statements.append(
                f"INSERT INTO {_quote(self._table(table))} ({cols}) SELECT {cols} FROM "
                f"{_quote(self._stage_table(table))} WHERE {BATCH_ID} = {int(batch_id)}"
            )
        statements.append(
            f"INSERT INTO {_quote(self._table(_BATCHES_TABLE))} "
            f"(batch_id, committed_at, row_counts) VALUES "
            f"({int(batch_id)}, {time.time()!r}, '{json.dumps(counts, sort_keys=True)}')"
        )
        for table in tables:
            statements.append(
                f"DELETE FROM {_quote(self._stage_table(table))} WHERE {BATCH_ID} = {int(batch_id)}"
            )
        self._execute(statements, transaction=True)
        return True

    def is_committed(self, batch_id: int) -> bool:
        """True when ``tickwheel_batches`` holds ``batch_id``. One indexed query."""
        self._ensure_base()
        rows = self._query(
            f"SELECT 1 FROM {_quote(self._table(_BATCHES_TABLE))} WHERE batch_id = {int(batch_id)}"
        )
        return bool(rows)

    def committed_batches(self) -> list[int]:
        """Return the committed batch ids in order."""
        self._ensure_base()
        rows = self._query(
            f"SELECT batch_id FROM {_quote(self._table(_BATCHES_TABLE))} ORDER BY batch_id"
        )
        return [int(r[0]) for r in rows]

    def read_table(self, spark: SparkSession, table: str) -> DataFrame | None:
        """Read ``table`` back through Spark JDBC with its original Spark types."""
        self._ensure_base()
        rows = self._query(
            f"SELECT spark_schema FROM {_quote(self._table(_SCHEMAS_TABLE))} "
            f"WHERE table_name = '{table}'"
        )
        if not rows:
            return None
        from pyspark.sql.types import StructType

        schema = StructType.fromJson(json.loads(rows[0][0]))
        reader = spark.read.format("jdbc").option("dbtable", self._table(table))
        for key, value in self._jdbc_options().items():
            reader = reader.option(key, value)
        df = reader.option("customSchema", _custom_schema(schema)).load()
        # SQLite hands BIGINT/TEXT back loosely typed: cast to the stored Spark types.
        from pyspark.sql import functions as F

        return df.select(
            *[F.col(f.name).cast(f.dataType).alias(f.name) for f in schema.fields],
            F.col(BATCH_ID).cast("long").alias(BATCH_ID),
        )


class SqliteSink(_JdbcSink):
    """SQLite database sink: Spark JDBC (Debian's xerial jar) + one SQLite transaction.

    The URL is ``jdbc:sqlite:/path/to/file.db``. DDL and the commit transaction go
    through Python's ``sqlite3`` on the driver (the database is a local file);
    the rows travel through Spark's JDBC writer, one writer at a time (SQLite
    has a single writer lock).
    """

    name = "sqlite"
    dialect = "sqlite"
    driver_class = "org.sqlite.JDBC"

    def __init__(self, url: str, *, prefix: str = "") -> None:
        """Use the SQLite file named by ``url`` (``jdbc:sqlite:PATH``)."""
        if not url.startswith("jdbc:sqlite:"):
            raise SinkError(
                f"a SQLite sink URL looks like jdbc:sqlite:/path/out.db, got {redact_url(url)!r}"
            )
        if _find_jar(_SQLITE_JARS, "libxerial-sqlite-jdbc-java") is None:
            raise SinkError(
                "the SQLite sink needs Debian's libxerial-sqlite-jdbc-java "
                "(run scripts/system-deps.sh)"
            )
        super().__init__(url, prefix=prefix)
        self.path = url[len("jdbc:sqlite:") :]
        parent = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(parent, exist_ok=True)

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=60, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        return conn

    def _execute(self, statements: Sequence[str], *, transaction: bool) -> None:
        conn = self._connect()
        try:
            if transaction:
                conn.execute("BEGIN IMMEDIATE")
            for sql in statements:
                conn.execute(sql)
            if transaction:
                conn.execute("COMMIT")
        except BaseException:
            if transaction and conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        finally:
            conn.close()

    def _query(self, sql: str) -> list[tuple[Any, ...]]:
        conn = self._connect()
        try:
            return list(conn.execute(sql).fetchall())
        finally:
            conn.close()

    def _write_parallelism(self) -> int | None:
        return 1


class PostgresSink(_JdbcSink):
    """PostgreSQL sink: Spark JDBC into staging tables, then ONE transaction per batch.

    The URL is ``jdbc:postgresql://host:port/db?user=...``, or None to take the
    server from ``PGHOST``/``PGPORT``/``PGDATABASE``; the password comes from
    ``PGPASSWORD`` or the password file (:func:`postgres_credentials`). The rows
    travel from the executors through Spark's JDBC writer (pgjdbc, from
    Debian's ``libpostgresql-jdbc-java``, the password a connection property),
    and :meth:`read_table` reads through Spark's JDBC reader. The DDL and the
    commit run through pg8000 in the Python process that runs the micro-batch
    (the driver on a classic session, the Python process beside the server
    under Spark Connect), with no JVM: pg8000 is pure Python (no libpq or other
    native library to install on that Python), speaks DB-API, and takes the
    password as a parameter, so the libpq-order lookup of
    :func:`postgres_credentials` stays its single source. The commit locks
    ``tickwheel_batches`` and in one transaction copies the batch's staged
    rows into the real tables and inserts ``tickwheel_batches(batch_id,
    committed_at, row_counts)``. The primary key on ``batch_id`` and the
    guarded INSERTs make a replayed or concurrent commit a no-op instead of
    doubling rows. The sink holds no session and no connection (one per
    statement group), so it pickles into a Connect server's ``foreachBatch``.
    """

    name = "postgresql"
    dialect = "postgresql"
    driver_class = "org.postgresql.Driver"

    def __init__(
        self, url: str | None, spark: SparkSession | None = None, *, prefix: str = ""
    ) -> None:
        """Use the database at ``url`` (secrets taken out of it).

        ``spark`` is accepted for compatibility and unused: the commit needs no
        JVM. Raises :class:`SinkError` when pg8000 or the pgjdbc jar is missing.
        """
        del spark
        credentials = postgres_credentials(url)
        _pg8000_dbapi()
        if _find_jar(_POSTGRES_JARS, "libpostgresql-jdbc-java") is None:
            raise SinkError(
                "the PostgreSQL sink needs Debian's libpostgresql-jdbc-java "
                "(run scripts/system-deps.sh)"
            )
        super().__init__(credentials.url, prefix=prefix)
        self._credentials = credentials
        self._target = _pg_target(credentials.url)

    def describe(self) -> str:
        """``postgresql:URL (user U, password from SOURCE)``, nothing secret in it."""
        return f"{self.name}:{self._credentials.describe()}"

    def _jdbc_options(self) -> dict[str, str]:
        # Spark hands its JDBC options to pgjdbc as connection properties, and
        # redacts "password" (spark.redaction.regex) wherever it shows them.
        return {**super()._jdbc_options(), **self._credentials.properties}

    def _connection(self) -> Any:
        """A new pg8000 DB-API connection (autocommit off), or a :class:`SinkError`
        naming the redacted URL and the cause (refused, authentication failed...)."""
        dbapi = _pg8000_dbapi()
        target = self._target
        secrets = self._credentials.properties
        sock = None
        try:
            ssl_context = _pg_ssl_context(target, secrets.get("sslpassword"))
            sock, host = _pg_socket(target)
            startup = dict(target.startup)
            return dbapi.connect(
                user=self._credentials.user,
                host=host,  # the socket is connected: pg8000 checks the certificate's name
                database=target.database,
                password=secrets.get("password"),
                sock=sock,
                ssl_context=ssl_context,
                application_name=startup.pop("application_name", None),
                startup_params=startup or None,
            )
        except Exception as exc:
            if sock is not None:
                _close_quietly(sock)
            raise SinkError(
                f"cannot connect to the PostgreSQL sink at {self._credentials.describe()}: "
                f"{_pg_failure(exc, password=secrets.get('password') is not None)}"
            ) from exc

    def _execute(self, statements: Sequence[str], *, transaction: bool) -> None:
        """Run ``statements`` in one transaction (rolled back on any error), or each
        in its own (autocommit)."""
        conn = self._connection()
        try:
            conn.autocommit = not transaction
            cursor = conn.cursor()
            for sql in statements:
                cursor.execute(sql)
            if transaction:
                conn.commit()
        except BaseException:
            if transaction:
                with contextlib.suppress(Exception):
                    conn.rollback()
            raise
        finally:
            _close_quietly(conn)

    def _query(self, sql: str) -> list[tuple[Any, ...]]:
        """The rows of ``sql`` as tuples of Python values (``BIGINT`` an int, ``TEXT``
        a str, ``NULL`` None), as the SQLite sink returns them."""
        conn = self._connection()
        try:
            conn.autocommit = True
            cursor = conn.cursor()
            cursor.execute(sql)
            return [tuple(row) for row in cursor.fetchall()]
        finally:
            _close_quietly(conn)

    def _write_parallelism(self) -> int | None:
        return None

    def commit(self, batch_id: int) -> bool:
        """One transaction: rows + ``tickwheel_batches`` row; a replayed batch is a no-op."""
        self._ensure_base()
        # Serialise concurrent committers of the same sink, then re-check inside.
        lock = f"LOCK TABLE {_quote(self._table(_BATCHES_TABLE))} IN SHARE ROW EXCLUSIVE MODE"
        tables = self._known_tables()
        if self.is_committed(batch_id):
            self._drop_staged(batch_id, tables)  # a replay's staged rows: not a second copy
            return False
        statements = [lock]
        guard = (
            f"NOT EXISTS (SELECT 1 FROM {_quote(self._table(_BATCHES_TABLE))} "
            f"WHERE batch_id = {int(batch_id)})"
        )
        for table in tables:
            cols = ", ".join(_quote(f.name) for f in self._schemas[table].fields)
            cols += f", {_quote(BATCH_ID)}"
            statements.append(
                f"INSERT INTO {_quote(self._table(table))} ({cols}) SELECT {cols} FROM "
                f"{_quote(self._stage_table(table))} WHERE {BATCH_ID} = {int(batch_id)} "
                f"AND {guard}"
            )
        count_exprs = ", ".join(
            f"'{t}', (SELECT COUNT(*) FROM {_quote(self._stage_table(t))} "
            f"WHERE {BATCH_ID} = {int(batch_id)})"
            for t in tables
        )
        statements.append(
            f"INSERT INTO {_quote(self._table(_BATCHES_TABLE))} "
            f"(batch_id, committed_at, row_counts) SELECT {int(batch_id)}, {time.time()!r}, "
            f"json_build_object({count_exprs})::text WHERE {guard}"
        )
        for table in tables:
            statements.append(
                f"DELETE FROM {_quote(self._stage_table(table))} WHERE {BATCH_ID} = {int(batch_id)}"
            )
        self._execute(statements, transaction=True)
        return True


def make_sink(kind: str, output: str, spark: SparkSession, *, url: str | None = None) -> BatchSink:
    """Build the sink named ``kind`` (parquet, sqlite or postgresql). O(1).

    ``output`` is the output directory (parquet) and the default home of the
    SQLite file (``OUT/tickwheel.db``); ``url`` overrides the JDBC URL. For
    PostgreSQL it is required unless ``PGHOST``/``PGPORT``/``PGDATABASE`` say
    where the server is; the password is best left out of it
    (:func:`postgres_credentials`). No sink keeps ``spark``: their commits need
    no session (it stays a parameter for the callers).
    """
    if kind == "parquet":
        return ParquetSink(output, spark)
    if kind == "sqlite":
        return SqliteSink(
            url or f"jdbc:sqlite:{os.path.join(os.path.abspath(output), 'tickwheel.db')}"
        )
    if kind in ("postgresql", "postgres"):
        return PostgresSink(url)
    raise SinkError(f"unknown sink {kind!r}: choose parquet, sqlite or postgresql")

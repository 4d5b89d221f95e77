"""Output sinks for the incremental pipeline: one interface, published once per batch id.

Every sink stores the tables of one micro-batch (``outcomes``, ``unmatched``,
``rejected``, ``late``) under that batch's id, in two steps, around the
checkpoint's commit of the batch:

``stage(batch_id, tables, attempt)``
    writes the rows where no reader looks (a staging directory, or staging
    tables' rows marked with the attempt), under names of the attempt's own,
    and returns what it staged. No other attempt's files or rows are touched:
    a crashed or fenced attempt's are never read, and are dropped later.
``commit(batch_id, staged)``
    publishes what the checkpoint's commit named, exactly once. A batch id that
    is already published is a no-op, so a roll-forward after a crash, or a
    replayed micro-batch, never adds a second copy of its rows.

Sinks:

* :class:`ParquetSink` (default, embedded): Spark's streaming file sink layout,
  ``OUT/<table>/batch_id=N/part-*.parquet`` named in Spark's own log
  ``OUT/<table>/_spark_metadata/`` (:mod:`.file_sink_log`), which every Spark
  reader honours, so ``spark.read.parquet(OUT/<table>)`` reads only committed
  batches; ``OUT/_batches/N.json`` marks a batch published. ``OUT`` may be a
  local path or any URI Spark writes.
* :class:`SqliteSink`: Spark JDBC with Debian's xerial jar into staging tables,
  then one SQLite transaction copies the committed attempt's rows into the real
  tables and inserts the ``tickwheel_batches`` row.
* :class:`PostgresSink`: Spark JDBC with Debian's pgjdbc jar into staging tables,
  then ONE PostgreSQL transaction (through pg8000, in the Python process that runs
  the micro-batch: the driver on a classic session, the Python process beside the
  server under Spark Connect) checks ``tickwheel_batches``, copies the committed
  attempt's rows into the real tables and inserts the ``tickwheel_batches(batch_id,
  ...)`` row: results and offsets in one transaction, so a replayed batch is a no-op.

The package keeps one module per sink beside the contract they share:
:mod:`.base` (:class:`BatchSink`, :class:`SinkError`), :mod:`.make`
(:func:`make_sink`, :func:`as_sink`, :func:`reopen_sink`), :mod:`.function`
(:class:`FunctionSink`),
:mod:`.parquet` and :mod:`.file_sink_log` (Spark's file sink log), :mod:`.jdbc`
(what the two JDBC sinks share, and the driver jars), :mod:`.sqlite`,
:mod:`.postgres` (and its pg8000 connection) and :mod:`.credentials` (the
PostgreSQL password, found as libpq finds it).

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

from ..spark.jdbc_drivers import jdbc_jars, spark_jdbc_conf
from .base import BATCH_ID, BatchSink, SinkError, SinkFunction
from .credentials import (
    PasswordFileWarning,
    PostgresCredentials,
    pgpass_password,
    postgres_credentials,
    redact_url,
)
from .file_sink_log import FileSinkLog
from .function import FunctionSink
from .make import as_sink, make_sink, reopen_sink
from .parquet import ParquetSink
from .postgres import PostgresSink
from .sqlite import SqliteSink

__all__ = [
    "BATCH_ID",
    "BatchSink",
    "FileSinkLog",
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
    "reopen_sink",
    "spark_jdbc_conf",
]

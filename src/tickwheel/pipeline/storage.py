"""Where the pipeline keeps its files: a local path, or any URI Spark can write.

The stream's checkpoint, the Parquet sink's markers and the batch summary are
small files that the drivers write and read themselves; the tables are written
by Spark. A path without a scheme is local and goes through :mod:`os`
(:class:`LocalStorage`); a URI (``s3a://``, ``abfss://``, ``gs://``,
``hdfs://``, ``viewfs://``, ``file:``) goes through Hadoop's ``FileSystem`` in
the session's JVM (:class:`HadoopStorage`), so whatever Spark itself can read
and write there, so can the pipeline.

The operations are the few that hold on an object store as on a disk:

* :meth:`Storage.create` writes a **new** file that readers see whole or not
  at all (Spark's ``CheckpointFileManager.createAtomic`` for a URI: a hidden
  temporary file renamed to a name that must not exist; a hard link for a
  local path), and refuses a name that exists. Commits are made of these.
* :meth:`Storage.rename` moves one file to a name that must not exist (a
  staged output file to its published name): one step on a local disk, HDFS
  and ABFS; a copy, then a delete, on S3 and GCS, whose copy still appears
  whole;
* :meth:`Storage.delete` removes a file or a tree (cleaning what a failed
  attempt left, or old states);
* :meth:`Storage.exists`, :meth:`Storage.list_names`,
  :meth:`Storage.read_bytes`, :meth:`Storage.size`, :meth:`Storage.uri`.

There is no rename of a directory and no overwrite of a file, because an
object store has neither as one step.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import uuid
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import quote, unquote, urlsplit

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "HadoopStorage",
    "LocalStorage",
    "Storage",
    "StorageError",
    "absolute",
    "create_json",
    "fsync_directory",
    "is_data_file",
    "is_uri",
    "join",
    "local_path",
    "read_json",
    "storage_for",
]

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


class StorageError(RuntimeError):
    """A path cannot be used where it was given."""


def is_uri(path: str) -> bool:
    """Whether ``path`` names a scheme (``s3a://b/k``, ``file:/x``), as Hadoop reads it. O(1)."""
    return _SCHEME.match(path) is not None


def is_data_file(name: str) -> bool:
    """Whether a file named ``name`` is a Parquet data file of a table, as Spark's
    readers take them: ``*.parquet``, not hidden (``.``/``_``: temporary files,
    checksums, ``_SUCCESS``). O(len)."""
    return name.endswith(".parquet") and not name.startswith((".", "_"))


def local_path(path: str) -> str:
    """``path`` as a local path: a ``file:`` URI's path (decoded), else unchanged. O(len).

    Spark names local files ``file:/x`` (or ``file:///x``, with ``%20`` for a space).
    """
    if not path.startswith("file:"):
        return path
    return unquote(urlsplit(path).path)


def absolute(path: str) -> str:
    """``path`` made absolute when local; a URI is kept as given. O(1)."""
    return path if is_uri(path) else os.path.abspath(path)


def join(base: str, *names: str) -> str:
    """``base/name/...``, keeping a URI's scheme and authority (``os.path.join`` would not
    on every platform). O(len)."""
    if not is_uri(base):
        return os.path.join(base, *names)
    return "/".join([base.rstrip("/"), *names])


class Storage(Protocol):
    """The file operations the pipeline's own commits need; see the module doc."""

    def exists(self, path: str) -> bool:
        """Whether a file or directory is at ``path``."""
        ...

    def list_names(self, directory: str) -> list[str]:
        """The names in ``directory`` (none when it is missing). O(entries)."""
        ...

    def read_bytes(self, path: str, limit: int | None = None) -> bytes:
        """The content of the file at ``path``, its first ``limit`` bytes if given
        (FileNotFoundError when missing)."""
        ...

    def create(self, path: str, data: bytes) -> None:
        """Write a new file at ``path``, seen whole or not at all; FileExistsError if
        one is there. Its parents are made as needed."""
        ...

    def usable(self) -> bool:
        """Whether calls can still be made (a stopped session's JVM cannot take them)."""
        ...

    def parquet_rows(self, directory: str) -> int:
        """The rows of the Parquet files in ``directory``, from their footers."""
        ...

    def delete(self, path: str) -> None:
        """Remove the file or tree at ``path``; a missing one is fine."""
        ...

    def rename(self, source: str, target: str) -> None:
        """Move the file ``source`` to ``target``, a name that must not exist
        (FileExistsError; FileNotFoundError without ``source``). Its parents are made."""
        ...

    def uri(self, path: str) -> str:
        """``path`` as the URI Spark's readers name the file by."""
        ...

    def size(self, path: str) -> int:
        """The length in bytes of the file at ``path``."""
        ...

    def list_files(self, directory: str) -> Iterator[tuple[str, int, int]]:
        """``(path, size, modification ms)`` of every file under ``directory``, recursively."""
        ...

    def glob(self, pattern: str) -> list[tuple[str, int]]:
        """``(path, size)`` of the files matching ``pattern`` (``*``, ``?``, ``[...]``)."""
        ...


class LocalStorage:
    """Files on a local or mounted disk, through :mod:`os`; durable (fsynced) creates."""

    def exists(self, path: str) -> bool:
        """O(1)."""
        return os.path.exists(path)

    def list_names(self, directory: str) -> list[str]:
        """O(entries)."""
        try:
            return os.listdir(directory)
        except FileNotFoundError:
            return []

    def read_bytes(self, path: str, limit: int | None = None) -> bytes:
        """O(size)."""
        with open(path, "rb") as fh:
            return fh.read() if limit is None else fh.read(limit)

    def create(self, path: str, data: bytes) -> None:
        """A hidden temporary file, fsynced, hard-linked to ``path`` (which fails if the name
        exists: no overwrite), then the directory fsynced. O(size)."""
        directory = os.path.dirname(path) or "."
        os.makedirs(directory, exist_ok=True)
        tmp = os.path.join(directory, f".{os.path.basename(path)}.{uuid.uuid4().hex}.tmp")
        try:
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.link(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)
        fsync_directory(directory)

    def usable(self) -> bool:
        """Always. O(1)."""
        return True

    def parquet_rows(self, directory: str) -> int:
        """pyarrow reads each footer. O(files)."""
        import pyarrow.parquet as pq  # type: ignore[import-untyped]

        return sum(
            pq.read_metadata(os.path.join(directory, name)).num_rows
            for name in os.listdir(directory)
            if is_data_file(name)
        )

    def delete(self, path: str) -> None:
        """O(files)."""
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)

    def size(self, path: str) -> int:
        """O(1)."""
        return os.path.getsize(path)

    def rename(self, source: str, target: str) -> None:
        """A hard link at ``target`` (refused if the name exists), then ``source``
        removed, then the directory fsynced. O(1)."""
        directory = os.path.dirname(target) or "."
        os.makedirs(directory, exist_ok=True)
        os.link(source, target)
        os.remove(source)
        fsync_directory(directory)

    def uri(self, path: str) -> str:
        """``file://`` and the absolute path, with what a URI's path may not hold (a space,
        ``%``...) percent-encoded, as Hadoop's ``Path.toUri`` writes it. O(len)."""
        return "file://" + quote(os.path.abspath(path), safe="/:@!$&'()*+,;=")

    def list_files(self, directory: str) -> Iterator[tuple[str, int, int]]:
        """O(files); a file lists itself, as Hadoop's ``listFiles`` does."""
        if os.path.isfile(directory):
            info = os.stat(directory)
            yield directory, info.st_size, int(info.st_mtime * 1000)
            return
        for parent, _dirs, names in os.walk(directory):
            for name in names:
                path = os.path.join(parent, name)
                with contextlib.suppress(FileNotFoundError):  # removed since listed
                    info = os.stat(path)
                    yield path, info.st_size, int(info.st_mtime * 1000)

    def glob(self, pattern: str) -> list[tuple[str, int]]:
        """O(files matched); ``**`` spans directories."""
        import glob

        return [
            (path, os.path.getsize(path))
            for path in glob.glob(pattern, recursive=True)
            if os.path.isfile(path)
        ]


def fsync_directory(path: str) -> None:
    """Make a new or renamed name in the local directory ``path`` durable. O(1)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class HadoopStorage:
    """Files at URIs, through Hadoop's ``FileSystem`` in a classic session's JVM (Py4J).

    The file system of each URI is the one Spark's own readers use, with the
    session's Hadoop configuration (``spark.hadoop.*``: credentials, ``viewfs``
    mount tables, committers).
    """

    def __init__(self, spark: SparkSession) -> None:
        """Bind to ``spark``'s JVM and Hadoop configuration. O(1)."""
        self._context = spark.sparkContext
        jvm = self._context._jvm
        assert jvm is not None
        self._jvm = jvm
        self._conf = spark.sparkContext._jsc.hadoopConfiguration()
        self._managers: dict[str, Any] = {}  # Spark's CheckpointFileManager, by file system
        self._classes: dict[str, Any] = {}  # by name: see _class

    def _class(self, name: str) -> Any:
        """The JVM class ``name``, looked up once: py4j resolves a dotted name one
        segment at a time, each a round trip and a search of the class path."""
        found = self._classes.get(name)
        if found is None:
            found = self._classes[name] = getattr(self._jvm, name)
        return found

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError("HadoopStorage holds a JVM; it is not shipped to another process")

    def _path(self, path: str) -> tuple[Any, Any]:
        jpath = self._class("org.apache.hadoop.fs.Path")(path)
        return jpath, jpath.getFileSystem(self._conf)

    def exists(self, path: str) -> bool:
        """One metadata call."""
        jpath, fs = self._path(path)
        return bool(fs.exists(jpath))

    def list_names(self, directory: str) -> list[str]:
        """One listing call (pages of it, on an object store)."""
        jpath, fs = self._path(directory)
        try:
            return [str(s.getPath().getName()) for s in fs.listStatus(jpath)]
        except Exception as exc:
            if _java_class(exc) == "java.io.FileNotFoundException":
                return []
            raise

    def read_bytes(self, path: str, limit: int | None = None) -> bytes:
        """One open and read."""
        jpath, fs = self._path(path)
        try:
            stream = fs.open(jpath)
        except Exception as exc:
            if _java_class(exc) == "java.io.FileNotFoundException":
                raise FileNotFoundError(path) from None
            raise
        try:
            if limit is not None:
                stream = self._class("org.apache.commons.io.input.BoundedInputStream")(
                    stream, limit
                )
            return bytes(self._class("org.apache.commons.io.IOUtils").toByteArray(stream))
        finally:
            stream.close()

    def _manager(self, jpath: Any) -> Any:
        """Spark's ``CheckpointFileManager`` of ``jpath``'s file system, made once."""
        uri = jpath.toUri()
        key = f"{uri.getScheme()}://{uri.getAuthority()}"
        manager = self._managers.get(key)
        if manager is None:
            checkpointing = "org.apache.spark.sql.execution.streaming.checkpointing"
            manager = self._class(f"{checkpointing}.CheckpointFileManager").create(
                jpath, self._conf
            )
            self._managers[key] = manager
        return manager

    def create(self, path: str, data: bytes) -> None:
        """Spark's ``CheckpointFileManager.createAtomic`` without overwrite, as Spark's own
        offset and commit logs write their entries. O(size)."""
        jpath, _ = self._path(path)
        manager = self._manager(jpath)
        try:
            stream = manager.createAtomic(jpath, False)
        except Exception as exc:
            if _java_class(exc) != "java.io.FileNotFoundException":
                raise
            manager.mkdirs(jpath.getParent())  # FileContext's create makes no parents
            stream = manager.createAtomic(jpath, False)
        try:
            stream.write(bytearray(data))
        except BaseException:
            stream.cancel()
            raise
        try:
            stream.close()
        except Exception as exc:
            if _java_class(exc) == "org.apache.hadoop.fs.FileAlreadyExistsException":
                raise FileExistsError(path) from None
            raise

    def usable(self) -> bool:
        """Whether the session's SparkContext is still up. O(1), no JVM call."""
        return self._context._jsc is not None

    def parquet_rows(self, directory: str) -> int:
        """parquet-hadoop reads each footer in the JVM (no Spark job). O(files)."""
        total = 0
        for name in self.list_names(directory):
            if not is_data_file(name):
                continue
            jpath, _ = self._path(join(directory, name))
            source = self._class("org.apache.parquet.hadoop.util.HadoopInputFile").fromPath(
                jpath, self._conf
            )
            reader = self._class("org.apache.parquet.hadoop.ParquetFileReader").open(source)
            try:
                total += int(reader.getRecordCount())
            finally:
                reader.close()
        return total

    def delete(self, path: str) -> None:
        """One recursive delete (many calls, on an object store)."""
        jpath, fs = self._path(path)
        fs.delete(jpath, True)

    def size(self, path: str) -> int:
        """One metadata call."""
        jpath, fs = self._path(path)
        return int(fs.getFileStatus(jpath).getLen())

    def rename(self, source: str, target: str) -> None:
        """Hadoop's ``rename``, which refuses an existing target (on S3 and GCS a copy
        and a delete). A few calls."""
        jsource, fs = self._path(source)
        jtarget, _ = self._path(target)
        fs.mkdirs(jtarget.getParent())
        if not fs.rename(jsource, jtarget):
            if fs.exists(jtarget):
                raise FileExistsError(target)
            if not fs.exists(jsource):
                raise FileNotFoundError(source)
            raise OSError(f"{source}: could not be renamed to {target}")

    def uri(self, path: str) -> str:
        """The file system's qualified URI of ``path``. O(1) calls."""
        jpath, fs = self._path(path)
        return str(fs.makeQualified(jpath).toUri().toString())

    def list_files(self, directory: str) -> Iterator[tuple[str, int, int]]:
        """Hadoop's recursive ``listFiles``."""
        jpath, fs = self._path(directory)
        files = fs.listFiles(jpath, True)
        while files.hasNext():
            status = files.next()
            yield (
                str(status.getPath().toString()),
                int(status.getLen()),
                int(status.getModificationTime()),
            )

    def glob(self, pattern: str) -> list[tuple[str, int]]:
        """Hadoop's ``globStatus``."""
        jpath, fs = self._path(pattern)
        found = fs.globStatus(jpath) or []
        return [(str(s.getPath().toString()), int(s.getLen())) for s in found if s.isFile()]


def _java_class(exc: BaseException) -> str | None:
    """The Java exception's class behind a Py4J error, if it is one."""
    java = getattr(exc, "java_exception", None)
    if java is None:
        return None
    return str(java.getClass().getName())


def storage_for(path: str, spark: SparkSession | None = None) -> Storage:
    """The storage of ``path``: local without a scheme, else Hadoop's in ``spark``'s JVM.

    A URI needs a classic session. Under Spark Connect the pipeline's own
    files are written by the Python process beside the server, which has no
    JVM to reach Hadoop through: there they must be a path that machine sees.
    """
    if not is_uri(path):
        return LocalStorage()
    if spark is None:
        raise StorageError(f"{path}: a URI needs a Spark session to reach its file system")
    from pyspark.sql.session import SparkSession as ClassicSession

    if not isinstance(spark, ClassicSession):  # Spark Connect's session is another class
        raise StorageError(
            f"{path}: under Spark Connect, tickwheel's checkpoint and Parquet sink take a "
            "path on the Connect server's machine (its foreachBatch process has no JVM to "
            "reach Hadoop's FileSystem through); give a local or mounted path, or run on a "
            "classic session for a URI"
        )
    return HadoopStorage(spark)


def create_json(storage: Storage, path: str, payload: Mapping[str, Any]) -> None:
    """A new JSON file at ``path`` (:meth:`Storage.create`). O(size)."""
    storage.create(path, json.dumps(payload, sort_keys=True, indent=1).encode())


def read_json(storage: Storage, path: str) -> dict[str, Any]:
    """The JSON object in the file at ``path``. O(size)."""
    data: dict[str, Any] = json.loads(storage.read_bytes(path))
    return data

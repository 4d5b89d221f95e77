"""Storage at a URI without a server: Hadoop's ``viewfs://`` mounted over a local directory.

``viewfs://NAME/data/...`` is a Hadoop file system whose mount table
(``fs.viewfs.mounttable.NAME.link./data``) points at ``file://ROOT``: Spark
and tickwheel reach it only through Hadoop's ``FileSystem``, as they would
``hdfs://`` or ``s3a://``, while the test reads the files under ``ROOT``.

:class:`FileWatch` proves what a commit protocol for object stores must not
do: it samples every visible file under ``ROOT`` (no component starting with
``.`` or ``_``, which Spark's readers skip, as they skip the temporary names
Spark's writers and ``createAtomic`` use) and records each one's identity
(inode, size, modification time). A visible path whose identity changes was
overwritten; one identity seen at two visible paths was renamed (a
directory's rename moves its files, inodes and times unchanged).
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class ViewFs:
    """One mount table: ``viewfs://{name}/data`` over ``root``."""

    root: Path
    name: str = field(default_factory=lambda: f"t{uuid.uuid4().hex[:12]}")

    @property
    def settings(self) -> dict[str, str]:
        """The Hadoop settings of the mount table."""
        return {f"fs.viewfs.mounttable.{self.name}.link./data": self.root.resolve().as_uri()}

    def uri(self, *parts: str) -> str:
        """``viewfs://NAME/data/PARTS``."""
        return "/".join([f"viewfs://{self.name}/data", *parts])

    def configure(self, spark: Any) -> None:
        """Add the mount table to a classic session's Hadoop configuration."""
        conf = spark.sparkContext._jsc.hadoopConfiguration()
        for key, value in self.settings.items():
            conf.set(key, value)

    def hadoop_conf_dir(self, directory: Path) -> Path:
        """A ``HADOOP_CONF_DIR`` whose ``core-site.xml`` holds the mount table, as a
        cluster's client configuration would; Spark's launcher puts it on the JVM's
        class path."""
        directory.mkdir(parents=True, exist_ok=True)
        props = "".join(
            f"<property><name>{k}</name><value>{v}</value></property>"
            for k, v in self.settings.items()
        )
        (directory / "core-site.xml").write_text(
            f'<?xml version="1.0"?>\n<configuration>{props}</configuration>\n', encoding="utf-8"
        )
        return directory


def _visible(relative: str) -> bool:
    return not any(part.startswith((".", "_")) for part in relative.split(os.sep))


class FileWatch:
    """Samples the visible files under ``root`` until stopped; see the module doc."""

    def __init__(self, root: Path, interval_s: float = 0.02) -> None:
        self.root, self.interval_s = root, interval_s
        self.identity: dict[str, tuple[int, int, int]] = {}
        self.path_of: dict[tuple[int, int, int], str] = {}
        self.overwritten: set[str] = set()
        self.moved: set[tuple[str, str]] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _files(self) -> Iterator[tuple[str, os.stat_result]]:
        for parent, _dirs, names in os.walk(self.root):
            for name in names:
                path = os.path.join(parent, name)
                relative = os.path.relpath(path, self.root)
                if not _visible(relative):
                    continue
                try:
                    yield relative, os.stat(path)
                except FileNotFoundError:  # deleted meanwhile
                    continue

    def sample(self) -> None:
        """Record one listing."""
        for relative, info in self._files():
            ident = (info.st_ino, info.st_size, info.st_mtime_ns)
            if self.identity.setdefault(relative, ident) != ident:
                self.overwritten.add(relative)
            # a rename keeps the inode, the size and the modification time
            first = self.path_of.setdefault(ident, relative)
            if first != relative:
                self.moved.add((first, relative))

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self) -> FileWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.sample()

    def check(self) -> None:
        """Fail if a visible file was overwritten or renamed."""
        assert not self.overwritten, f"visible files overwritten: {sorted(self.overwritten)[:10]}"
        assert not self.moved, f"visible files renamed: {sorted(self.moved)[:10]}"
        assert self.identity, "the watch saw no file at all"

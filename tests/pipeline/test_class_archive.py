"""The class-data archive for cold starts: found only when checked, never when damaged.

The end-to-end test records a real archive (two short Spark runs in child
processes, about 30 s) and runs the CLI on it in a fresh JVM. When this machine's
cache already holds one for this JVM and these jars (``make test`` records it
first, with the same :func:`prepare.build`), the test takes that one instead of
recording it again; if that recording failed, the test records, and fails loudly.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tickwheel.pipeline import prepare
from tickwheel.pipeline.spark import class_archive as archive

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "orders.toml"
JAVA = shutil.which("java")
needs_java = pytest.mark.skipif(JAVA is None, reason="no java on the PATH")
#: What HotSpot prints when it cannot map an archive (and, with -Xshare:auto, goes on without).
UNUSABLE = "Unable to use shared archive"


@pytest.fixture(scope="module")
def machine_archive() -> Path | None:
    """The checked archive this machine's cache holds for this JVM and these jars.

    Module-scoped, so it is looked up before ``cache`` points the cache elsewhere.
    """
    return archive.find() if os.environ.get(archive.CACHE_ENV) is None else None


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(archive.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(archive.ARCHIVE_ENV, raising=False)
    return tmp_path / "cache"


def test_fingerprint_follows_the_java_binary_and_every_jar(tmp_path: Path) -> None:
    java = tmp_path / "java"
    java.write_bytes(b"jvm")
    jars = tmp_path / "jars"
    jars.mkdir()
    (jars / "a.jar").write_bytes(b"a")
    first = archive.fingerprint(str(java), jars)
    assert first == archive.fingerprint(str(java), jars)
    (jars / "b.jar").write_bytes(b"b")
    second = archive.fingerprint(str(java), jars)
    os.utime(jars / "a.jar", ns=(1, 1))
    third = archive.fingerprint(str(java), jars)
    java.write_bytes(b"another jvm")
    fourth = archive.fingerprint(str(java), jars)
    assert len({first, second, third, fourth}) == 4
    jdbc = tmp_path / "jdbc.jar"
    jdbc.write_bytes(b"driver")
    without = archive.fingerprint(str(java), jars, classpath=[])
    with_jdbc = archive.fingerprint(str(java), jars, classpath=[str(jdbc)])
    assert without != with_jdbc  # the class path's first jars are part of the archive


def test_session_conf_puts_the_jdbc_jars_first_as_the_stream_does() -> None:
    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    from tickwheel.pipeline.sinks import spark_jdbc_conf

    stream_classpath = spark_jdbc_conf().get("spark.driver.extraClassPath")
    assert archive.session_conf().get("spark.driver.extraClassPath") == stream_classpath


@needs_java
def test_find_offers_only_the_archive_under_its_final_name(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    digest = archive.fingerprint()
    assert digest is not None
    final = archive.archive_path(digest)
    assert final.parent == cache
    assert archive.find() is None
    cache.mkdir()
    final.with_name(final.name + ".tmp-1").write_bytes(b"half written")
    assert archive.find() is None  # a temporary name is never used
    final.write_bytes(b"checked")
    assert archive.find() == final
    monkeypatch.setenv(archive.ARCHIVE_ENV, "off")
    assert archive.find() is None


@needs_java
def test_startup_note_names_the_archive_only_for_a_local_master(cache: Path) -> None:
    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    assert archive.startup_note("spark://host:7077") == (None, "")
    assert archive.startup_note("local[2]") == (
        None,
        "no class archive: see `tickwheel pipeline prepare`",
    )
    digest = archive.fingerprint()
    assert digest is not None
    cache.mkdir()
    archive.archive_path(digest).write_bytes(b"checked")
    assert archive.startup_note("local[2]") == (archive.archive_path(digest), "class archive")
    assert archive.startup_note("yarn") == (None, "")


@needs_java
def test_an_unusable_cache_directory_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory", encoding="utf-8")
    monkeypatch.setenv(archive.CACHE_ENV, str(blocker / "cache"))
    with pytest.raises(archive.ArchiveError, match=r"cannot make the cache directory .*a-file"):
        prepare.build(say=lambda _line: None)


def test_java_options_map_the_archive_and_fall_back_when_it_is_stale() -> None:
    assert archive.java_options(None) == []
    assert archive.java_options(Path("/x/a.jsa")) == ["-XX:SharedArchiveFile=/x/a.jsa",
                                                       "-Xshare:auto"]  # fmt: skip


@pytest.mark.jvm_process
@needs_java
@pytest.mark.spark
def test_a_damaged_archive_fails_its_check_and_is_not_installed(
    cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A truncated archive aborts a JVM; build() must not rename it into place."""
    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    real_child = prepare._child

    def record_truncated(args: list[str], step: str) -> None:
        if args[0] == "record":
            Path(args[1]).write_bytes(b"\x00" * 4096)  # not an archive
            return
        real_child(args, step)

    monkeypatch.setattr(prepare, "_child", record_truncated)
    with pytest.raises(archive.ArchiveError, match="checking failed"):
        prepare.build(say=lambda _line: None)
    assert archive.find() is None
    assert list(cache.iterdir()) == []  # the temporary file is removed too


@pytest.mark.jvm_process
@needs_java
@pytest.mark.spark
def test_a_recorded_archive_is_checked_installed_and_used_by_the_cli(
    machine_archive: Path | None, cache: Path, tmp_path: Path
) -> None:
    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    lines: list[str] = []
    if machine_archive is not None:  # recorded by `make test` with build(): taken as it is
        cache.mkdir()
        path = cache / machine_archive.name
        try:
            os.link(machine_archive, path)
        except OSError:  # another file system
            shutil.copyfile(machine_archive, path)
    else:
        path = prepare.build(say=lines.append)
        assert lines[-1].startswith(f"class archive: {path} (")
    assert path == archive.find()
    assert path.stat().st_size > 10 * 2**20
    assert prepare.build(say=lines.append) == path
    assert lines[-1].endswith("(already there)")

    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    cli = [sys.executable, "-m", "tickwheel._cli", "pipeline"]
    subprocess.run([*cli, "generate", "--orders", "500", "--out", str(tmp_path / "in")],
                   check=True, capture_output=True, env=env, timeout=120)  # fmt: skip
    # The stream's JVM puts the JDBC jars first on its class path: the archive must fit it
    # too. (The recording itself was a batch run.)
    stream = subprocess.run(
        [*cli, "stream", "--rules", str(EXAMPLE), "--input", str(tmp_path / "in"),
         "--output", str(tmp_path / "stream-out"), "--checkpoint", str(tmp_path / "ck"),
         "--trigger", "available-now"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert stream.returncode == 0, stream.stderr[-2000:]
    first = stream.stdout.splitlines()[0]
    assert "starting Spark (local[2]; JIT: C1 only; class archive)" in first  # a short run
    assert UNUSABLE not in stream.stdout + stream.stderr


def test_the_recording_run_uses_the_example_rules() -> None:
    from tickwheel.pipeline.rules import load_rules, parse_rules

    assert parse_rules(prepare._RULES) == load_rules(EXAMPLE)

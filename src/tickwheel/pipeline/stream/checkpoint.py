"""The stream's checkpoint: its owner, its state, its commits, and fault injection.

``CK/tickwheel/`` is kept through :mod:`..storage`, so it may be a local path
or any URI Spark writes (``hdfs://``, ``s3a://``, ``abfss://``...)::

    LOCK                  a local checkpoint's flock (the kernel drops it if we die)
    owners/T.json         the job holding the checkpoint, with its fencing token T
    owners/T.alive-K      its heartbeat (a URI checkpoint), owners/T.released its end
    plans/N.json          micro-batch N's write-ahead plan, made once
    state/N/A/            the carried state after batch N as attempt A wrote it: whole
                          (events/, ops/) or as its changes (events.added/, ...;
                          see .resident); A is the owner's token and an attempt id
    commits/N.json        the commit of batch N: the attempt whose state and outputs
                          count, its watermark, counts and state rows, and the rules,
                          input format, state format and release it was made with
    commits/N.T.json      the same, where a fence by owner T holds N.json (below)

Every file is created once, under a name that did not exist, and seen whole
or not at all (:meth:`~..storage.Storage.create`); no directory is renamed and
no file a reader may see is overwritten, which an object store could not do
in one step. Each attempt of a batch writes under names of its own, so a
crashed or fenced attempt never mixes its files with another's. Batch ``N``
is committed when, and only when, its commit file exists, and that file
names the attempt that counts: what no commit names is never read, and the
owner deletes it once the batch is committed (:meth:`StateStore.prune`).

**Fencing.** A job that froze (a long GC pause, a suspended VM, a network
partition) may wake after another job took the checkpoint over, and go on.
Storage offers no compare-and-set but "create if absent", so the commit of a
batch is a chain of such creates. Its first slot is ``commits/N.json``. A job
that takes the checkpoint over first *fences* the first batch not committed,
the one its predecessor may still be running: it creates, in that batch's
free slot, a fence naming its own token ``T``, whose next slot,
``commits/N.T.json``, only ``T`` commits in (or a later owner fences in turn,
if ``T`` dies first). A predecessor that wakes finds its slot taken and stops
(:class:`CheckpointFenced`); it never reaches a later batch, since batches
commit in order. So every batch before the fence is its predecessors' (their
commits stand, and any owner publishes their outputs alike), and every batch
from the fence on is the new owner's alone.

A query of ``start_stream`` releases its checkpoint when it ends: on a classic
session a ``StreamingQueryListener`` says so; under Spark Connect a daemon
thread polls ``query.isActive`` every :data:`QUERY_POLL_S` (:func:`when_inactive`),
since a Connect listener keeps a server stream open that a script stopping its
session right after the query ended would break, with pyspark's warnings at exit.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as dt
import fcntl
import logging
import os
import re
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from ..rules import format_duration
from ..storage import Storage, create_json, is_uri, join, read_json

if TYPE_CHECKING:
    import pyarrow as pa  # type: ignore[import-untyped]
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "FAULT_ENV",
    "FAULT_LOG_ENV",
    "FAULT_POINTS",
    "HEARTBEAT_ENV",
    "SNAPSHOT_EVERY",
    "SNAPSHOT_EVERY_ENV",
    "STATE_FORMAT",
    "Attempt",
    "CheckpointFenced",
    "CheckpointInUse",
    "CheckpointOwner",
    "ResidentState",
    "StateStore",
    "StreamError",
    "fault",
    "owner_holding",
    "snapshot_base",
    "snapshot_every",
    "when_inactive",
]

logger = logging.getLogger(__name__)

FAULT_ENV = "TICKWHEEL_FAULT"
FAULT_LOG_ENV = "TICKWHEEL_FAULT_LOG"
#: Seconds between an owner's heartbeats on a URI checkpoint (default 10).
HEARTBEAT_ENV = "TICKWHEEL_OWNER_HEARTBEAT_S"
#: Heartbeats an owner on another host may miss before it counts as gone.
MISSED_BEATS = 3
#: Seconds between two looks at whether a Spark Connect query is still active
#: (:func:`when_inactive`): its checkpoint is released at most this long after it ends.
QUERY_POLL_S = 1.0
#: Where ``TICKWHEEL_FAULT=POINT:BATCH`` can kill the driver, in batch order.
FAULT_POINTS = (
    "batch_start",  # the batch found not committed; nothing of it written
    "mid_batch",  # some outputs staged, the others being written
    "after_outputs",  # all outputs staged, next state maybe half-written
    "after_state",  # outputs and next state staged, nothing committed
    "after_commit",  # the checkpoint committed the batch; its outputs not published
    "after_sink_commit",  # outputs published in the sink; Spark's own commit log not yet
    "mid_snapshot",  # at a job's end, the state written whole beside its changelog, unmarked
)


#: The version of the state's format that this release writes. It reads every
#: earlier one: 1, the layout without ``commits/`` (``state/N/meta.json``); 2, the
#: commit files, which record the rules, the input format and the release; 3, a
#: directory per attempt (``state/N/A/``), commits that name it and the sink's
#: staged outputs, and the fenced commit slots (``commits/N.T.json``); 4, commits
#: that hold the state's changes since the previous batch, with a whole state every
#: K batches (:mod:`.resident`). Each has a checkpoint its last writer left in
#: ``tests/pipeline/fixtures/checkpoint-format-N/``.
STATE_FORMAT = 4


class StreamError(RuntimeError):
    """The stream cannot run (bad options, inconsistent checkpoint)."""


class CheckpointInUse(StreamError):
    """Another job holds the checkpoint's lock."""


class CheckpointFenced(StreamError):
    """A newer job took the checkpoint over: this one stops, and writes nothing more."""

    def __init__(self, checkpoint: str, ours: int | None, token: int, host: str | None) -> None:
        """The message names the newer owner's token and host. O(1)."""
        super().__init__(
            f"checkpoint {checkpoint} was taken over by token {token} on host "
            f"{host or 'unknown'}; this job (token {ours}) stops without writing again"
        )
        self.token, self.host = token, host

    @classmethod
    def found_in(cls, exc: BaseException) -> CheckpointFenced | None:
        """The fencing error inside ``exc`` (Spark's ``StreamingQueryException`` carries
        the text of foreachBatch's error, from whichever process ran it), or None.
        O(len(message))."""
        if isinstance(exc, cls):
            return exc
        found = _FENCED.search(str(exc))
        if found is None:
            return None
        ours = None if found["ours"] == "None" else int(found["ours"])
        return cls(found["checkpoint"], ours, int(found["token"]), found["host"])


_FENCED = re.compile(
    r"checkpoint (?P<checkpoint>\S+) was taken over by token (?P<token>\d+) on host "
    r"(?P<host>\S+); this job \(token (?P<ours>\w+)\)"
)


#: The (point, batch) where this process stopped itself already (:func:`fault`).
_STOPPED: set[tuple[str, int]] = set()


def fault(point: str, batch_id: int) -> None:
    """Stop at ``point`` of batch ``batch_id`` as ``TICKWHEEL_FAULT`` asks (tests).

    ``POINT:BATCH`` kills this process with SIGKILL; ``POINT:BATCH:stop``
    freezes its whole process group (its JVM and Python workers too) with
    SIGSTOP, as a long GC pause or a suspended VM would, until a SIGCONT.
    The process is the one that runs ``foreachBatch``: the driver on a classic
    session, the Python process beside the server under Spark Connect, whose
    standard error reaches the client only through the server's log, if at
    all; so the message also goes to the file ``TICKWHEEL_FAULT_LOG`` names.
    """
    spec = os.environ.get(FAULT_ENV)
    if not spec or not spec.startswith(f"{point}:{batch_id}"):
        return
    action = spec[len(f"{point}:{batch_id}") :]
    if action not in ("", ":stop") or (point, batch_id) in _STOPPED:
        return
    if action:
        _STOPPED.add((point, batch_id))  # once: a point reached again after SIGCONT goes on
    signal_name = "SIGSTOP of the process group" if action else "SIGKILL"
    message = f"tickwheel: fault injection: {signal_name} at {point} of batch {batch_id}\n"
    logger.critical("%s", message.rstrip("\n"))
    log = os.environ.get(FAULT_LOG_ENV)
    if log:
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(message)
            fh.flush()
            os.fsync(fh.fileno())
    if action:
        os.killpg(os.getpgrp(), signal.SIGSTOP)
    else:
        os.kill(os.getpid(), signal.SIGKILL)


class Attempt(NamedTuple):
    """One attempt at a batch: its owner's fencing token and an id of its own.

    Every file an attempt writes (the state, the sink's staged tables) is
    under a name made of :attr:`tag`, so no two attempts share a file.
    """

    token: int | None
    id: str

    @classmethod
    def new(cls, token: int | None) -> Attempt:
        """A new attempt of the owner with ``token``. O(1)."""
        return cls(token, uuid.uuid4().hex[:12])

    @property
    def tag(self) -> str:
        """``t<token>-<id>``: the attempt's part of its files' names. O(1)."""
        return f"t{self.token if self.token is not None else 0}-{self.id}"


class CheckpointOwner:
    """The one job that may write a checkpoint: a fencing token, and on a local path a flock.

    :meth:`acquire` refuses (:class:`CheckpointInUse`) while another job holds
    the checkpoint, and otherwise creates ``owners/T.json`` with a token ``T``
    one above every earlier one. Whether an earlier owner is gone:

    * on a local path, the kernel's ``flock`` of ``LOCK`` says so at once;
    * on a URI, an owner that ended cleanly left ``T.released``; one on this
      host is gone when its process is; one on another host is gone when its
      heartbeat (``T.alive-K``, a new file every :data:`HEARTBEAT_ENV`
      seconds) stops: we wait three beats to see.

    Each commit calls :meth:`check`: a newer token means another job took
    over (after deciding we were gone), and this one stops before it writes.
    That check is only the early word: between it and the write a job may
    freeze, so the commit itself is fenced too (:class:`StateStore`, and
    the module doc). Pickled (Spark Connect ships the state store to the
    process that runs ``foreachBatch``), an owner carries its token and
    host, not its lock or heartbeat, which stay with the job that took it.

    ``in_use``, when set, says whether the holder still needs the
    checkpoint (its query is active): a query that ended in this process
    releases at once for the next one here, before Spark's listener event
    that releases it otherwise has arrived.
    """

    #: The owners held in this process, by checkpoint root.
    _held: dict[str, CheckpointOwner] = {}

    def __init__(self, root: str, storage: Storage) -> None:
        """Nothing is taken until :meth:`acquire`. O(1)."""
        self.root, self.storage = root, storage
        self.owners = join(root, "owners")
        self.token: int | None = None
        self.in_use: Callable[[], bool] | None = None
        self._fd: int | None = None
        self._previous: dict[str, Any] | None = None
        self._beating: threading.Event | None = None

    def __getstate__(self) -> dict[str, Any]:
        """The token and where it lives; the lock, the heartbeat and the callback stay
        in the process that holds them. O(1)."""
        return {**self.__dict__, "_fd": None, "_beating": None, "in_use": None}

    def _owner_path(self, token: int, suffix: str = ".json") -> str:
        return join(self.owners, f"{token}{suffix}")

    def _tokens(self) -> tuple[list[int], list[str]]:
        names = self.storage.list_names(self.owners)
        tokens = sorted(int(n[:-5]) for n in names if n.endswith(".json") and n[:-5].isdigit())
        return tokens, names

    def _describe(self, info: Mapping[str, Any] | None) -> str:
        if not info:
            return "another job"
        return f"job pid {info.get('pid')} on {info.get('host')} since {info.get('since')}"

    def _in_use(self, info: Mapping[str, Any] | None) -> CheckpointInUse:
        return CheckpointInUse(
            f"checkpoint {_checkpoint_of(self.root)} is in use by {self._describe(info)}; two "
            "jobs on one checkpoint would corrupt it. Stop the other job or use another "
            "--checkpoint."
        )

    def acquire(self) -> None:
        """Take the checkpoint, or raise :class:`CheckpointInUse`. O(owners)."""
        held = CheckpointOwner._held.get(self.root)
        if held is not None and held.in_use is not None and not held.in_use():
            held.release()
        tokens, names = self._tokens()
        latest = tokens[-1] if tokens else None
        info = None
        if latest is not None:
            with contextlib.suppress(OSError, ValueError):
                info = read_json(self.storage, self._owner_path(latest))
        if not is_uri(self.root):
            self._lock_local(info)
        elif (
            latest is not None
            and owner_holding(self.root, self.storage, latest, info, wait=True)[0]
        ):
            raise self._in_use(info)
        self._previous = info
        token = (latest or 0) + 1
        try:
            create_json(self.storage, self._owner_path(token), {
                "token": token, "pid": os.getpid(), "host": socket.gethostname(),
                "since": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            })  # fmt: skip
        except FileExistsError:  # another job took the same token first
            self._unlock_local()
            raise self._in_use(None) from None
        self.token = token
        CheckpointOwner._held[self.root] = self
        for old in tokens[:-1]:  # the newest earlier owner stays, for the next one's check
            for name in names:
                if name.split(".")[0] == str(old):
                    self.storage.delete(join(self.owners, name))
        if is_uri(self.root):
            self._start_heartbeat(token)

    def _lock_local(self, info: Mapping[str, Any] | None) -> None:
        os.makedirs(self.root, exist_ok=True)
        fd = os.open(os.path.join(self.root, "LOCK"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise self._in_use(info) from None
        self._fd = fd

    def _unlock_local(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _start_heartbeat(self, token: int) -> None:
        stop = threading.Event()
        self._beating = stop

        def beat() -> None:
            count, previous = 0, None
            while not stop.wait(_heartbeat_seconds()):
                if not self.storage.usable() or (self.in_use is not None and not self.in_use()):
                    return  # the session stopped, or the query ended before its release
                count += 1
                path = self._owner_path(token, f".alive-{count}")
                with contextlib.suppress(Exception):  # a missed beat is only a later takeover
                    self.storage.create(path, b"")
                    if previous is not None:
                        self.storage.delete(previous)
                    previous = path

        atexit.register(stop.set)  # no beat while the interpreter and its JVM shut down
        threading.Thread(target=beat, name="tickwheel-owner-heartbeat", daemon=True).start()

    def write_owner(self, jvm_pid: int | None) -> None:
        """Record this job's JVM, and wait for a killed predecessor's JVM on this host.

        A driver killed with SIGKILL leaves its JVM to notice that its parent
        is gone; waiting for it means two JVMs never write the checkpoint.
        """
        assert self.token is not None
        with contextlib.suppress(FileExistsError):
            create_json(self.storage, self._owner_path(self.token, ".jvm.json"),
                        {"jvm_pid": jvm_pid})  # fmt: skip
        previous = self._previous
        if not previous or previous.get("host") != socket.gethostname():
            return
        with contextlib.suppress(OSError, ValueError):
            old = read_json(self.storage, self._owner_path(int(previous["token"]), ".jvm.json"))
            pid = old.get("jvm_pid")
            if isinstance(pid, int) and pid != jvm_pid:
                _wait_gone(pid, 60.0)

    def check(self) -> None:
        """Raise :class:`CheckpointFenced` if a newer job took the checkpoint over.
        O(owners)."""
        if self.token is None:
            raise StreamError(f"checkpoint {_checkpoint_of(self.root)}: this job holds no "
                              "ownership of it (released, or never taken)")  # fmt: skip
        tokens, _ = self._tokens()
        if tokens and tokens[-1] > self.token:
            raise self.fenced_by(tokens[-1])

    def fenced_by(self, token: int, host: str | None = None) -> CheckpointFenced:
        """The error of this job, fenced by the owner with ``token`` (whose host is read
        from its owner file when not given), logged at WARNING. O(1) calls."""
        if host is None:
            with contextlib.suppress(OSError, ValueError):
                host = read_json(self.storage, self._owner_path(token)).get("host")
        fenced = CheckpointFenced(_checkpoint_of(self.root), self.token, token, host)
        logger.warning("%s", fenced)
        return fenced

    def release(self) -> None:
        """Mark the end of this job's ownership. O(1)."""
        if self._beating is not None:
            self._beating.set()
            self._beating = None
        if self.token is not None and is_uri(self.root):
            with contextlib.suppress(Exception):
                self.storage.create(self._owner_path(self.token, ".released"), b"")
        if CheckpointOwner._held.get(self.root) is self:
            del CheckpointOwner._held[self.root]
        self.token = None
        self._unlock_local()


def owner_holding(
    root: str,
    storage: Storage,
    token: int,
    info: Mapping[str, Any] | None,
    *,
    wait: bool = False,
    now_ms: int | None = None,
) -> tuple[bool, str]:
    """Whether the owner with ``token`` still holds the checkpoint ``root``
    (``CK/tickwheel``), and how that was decided, in a few words for a reader.

    ``info`` is the owner's ``owners/T.json``. On a local path, a process
    holds the ``flock`` of ``LOCK``: tried on a fresh descriptor and released
    at once (a job starting in that instant would find the checkpoint in use;
    :meth:`CheckpointOwner.acquire` takes the flock itself instead). On a URI:
    ``T.released`` says the owner ended; an owner on this host holds it while
    its process runs; one on another host while its heartbeat goes on. With
    ``wait`` (:meth:`CheckpointOwner.acquire`, before it takes over), that is
    a new ``T.alive-K`` within :data:`MISSED_BEATS` heartbeats, watched for;
    without, the age of its last sign of life at ``now_ms`` (default: now),
    never waiting. O(owners) per listing; with ``wait``, up to
    :data:`MISSED_BEATS` heartbeats long.
    """
    if not is_uri(root):
        return _flock_held(root)
    owners = join(root, "owners")
    if f"{token}.released" in storage.list_names(owners):
        return False, "released"
    pid = info.get("pid") if info else None
    if info and info.get("host") == socket.gethostname() and isinstance(pid, int):
        alive = pid_alive(pid)
        return alive, f"process {pid} on this host is {'running' if alive else 'gone'}"
    beat_s = _heartbeat_seconds()
    if wait:
        return _beats_on(storage, owners, token, beat_s)
    signs = [
        mtime
        for path, _size, mtime in storage.list_files(owners)
        if path.rsplit("/", 1)[-1].startswith((f"{token}.alive", f"{token}.json"))
    ]
    if not signs:
        return False, "no heartbeat"
    now = int(time.time() * 1000) if now_ms is None else now_ms
    age = now - max(signs)
    alive = age < MISSED_BEATS * beat_s * 1000
    return alive, f"last heartbeat {format_duration(age)} ago (every {beat_s:g}s)"


def _flock_held(root: str) -> tuple[bool, str]:
    """Whether a process holds ``LOCK``'s flock: tried on a fresh descriptor, released
    at once. O(1)."""
    try:
        fd = os.open(os.path.join(root, "LOCK"), os.O_RDONLY)
    except FileNotFoundError:
        return False, "no LOCK file"
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True, "a process holds the flock on LOCK"
    finally:
        os.close(fd)  # closing releases a lock we took
    return False, "LOCK is free"


def _beats_on(storage: Storage, owners: str, token: int, beat_s: float) -> tuple[bool, str]:
    """Whether owner ``token`` leaves a new heartbeat within :data:`MISSED_BEATS` beats
    (it ends early when one comes, or its release). Up to that long."""
    beats = {n for n in storage.list_names(owners) if n.startswith(f"{token}.alive")}
    deadline = time.monotonic() + MISSED_BEATS * beat_s
    while time.monotonic() < deadline:
        time.sleep(min(1.0, beat_s))
        names = set(storage.list_names(owners))
        if f"{token}.released" in names:
            return False, "released"
        if {n for n in names if n.startswith(f"{token}.alive")} != beats:
            return True, "a new heartbeat"
    return False, f"no heartbeat in {MISSED_BEATS} beats of {beat_s:g}s"


def when_inactive(
    is_active: Callable[[], bool],
    then: Callable[[bool], None],
    *,
    interval_s: float = QUERY_POLL_S,
) -> threading.Event:
    """Call ``then`` once, from a daemon thread, when ``is_active()`` says False (``then(False)``)
    or raises (``then(True)``: the session is gone); ``is_active`` is asked every
    ``interval_s``. The event returned stops the watch; the interpreter's exit sets it.

    Under Spark Connect this takes the place of a ``StreamingQueryListener``: pyspark's
    client keeps a listener's events on a thread that reads a server stream, and a
    session stopped while that stream is open (a script that stops its session right
    after its query ended, before the listener removed itself) ends that thread with
    the warning ``StreamingQueryListenerBus Handler thread received exception`` (the
    channel closed, or "cannot schedule new futures after shutdown"). A poll holds no
    stream open: a stopped session only makes the next look raise. O(1) a look.
    """
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            try:
                active = bool(is_active())
            except Exception:  # the session was stopped: its queries with it
                if not stop.is_set():
                    then(True)
                return
            if not active:
                then(False)
                return
            stop.wait(interval_s)

    atexit.register(stop.set)  # no look while the interpreter shuts down
    threading.Thread(target=watch, name="tickwheel-query-watch", daemon=True).start()
    return stop


def _checkpoint_of(root: str) -> str:
    """The checkpoint a ``CK/tickwheel`` root belongs to."""
    return root.rstrip("/").rsplit("/", 1)[0]


def _heartbeat_seconds() -> float:
    return float(os.environ.get(HEARTBEAT_ENV) or 10)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (one we may not signal counts). O(1)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _wait_gone(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if b"java" not in fh.read():
                    return
        except OSError:
            return
        time.sleep(0.1)


#: A snapshot every this many commits (K), as Spark's ``minDeltasForSnapshot``.
SNAPSHOT_EVERY = 10
#: Environment variable that sets K for a job (tests use small values).
SNAPSHOT_EVERY_ENV = "TICKWHEEL_SNAPSHOT_EVERY"


def snapshot_every() -> int:
    """K: ``TICKWHEEL_SNAPSHOT_EVERY`` if set (an int >= 1), else :data:`SNAPSHOT_EVERY`. O(1)."""
    text = os.environ.get(SNAPSHOT_EVERY_ENV)
    if not text:
        return SNAPSHOT_EVERY
    try:
        k = int(text)
    except ValueError:
        k = 0
    if k < 1:
        raise ValueError(f"{SNAPSHOT_EVERY_ENV} must be an int >= 1, got {text!r}")
    return k


@dataclass
class ResidentState:
    """The state a committed batch left, held in this process.

    Exactly one of ``tables`` (Arrow, in the driver) and ``frames`` (Spark
    DataFrames, locally checkpointed) is set. ``attempt`` is the tag of the
    attempt whose commit made it; ``base`` the batch of the snapshot its
    chain of changelogs starts from, ``changelogs`` their number.
    """

    batch_id: int
    attempt: str | None
    rows: int
    base: int
    changelogs: int
    tables: dict[str, pa.Table] | None = None
    frames: dict[str, DataFrame] | None = None

    def matches(self, batch_id: int | None, meta: Mapping[str, Any]) -> bool:
        """Whether this is the state that the commit ``meta`` of ``batch_id`` names. O(1)."""
        return batch_id == self.batch_id and meta.get("attempt") == self.attempt

    def as_frames(self, spark: SparkSession) -> dict[str, DataFrame]:
        """The tables as DataFrames: held ones as local relations (no job). O(1) calls."""
        if self.frames is not None:
            return self.frames
        assert self.tables is not None
        from ..spark.frames import from_arrow

        return {name: from_arrow(spark, table) for name, table in self.tables.items()}

    def as_tables(self) -> dict[str, pa.Table]:
        """The tables as Arrow: held ones as they are, Spark's collected (a job each)."""
        if self.tables is not None:
            return self.tables
        assert self.frames is not None
        return {name: frame.toArrow() for name, frame in self.frames.items()}

    def release(self) -> None:
        """Let Spark drop the blocks of a state it keeps, now: a locally checkpointed
        RDD is otherwise kept until the JVM's garbage collector finds it unreachable
        (Spark's cleaner; a Connect client's frame releases it when collected).
        O(tables)."""
        for frame in (self.frames or {}).values():
            jdf = getattr(frame, "_jdf", None)  # None under Spark Connect
            if jdf is not None:
                with contextlib.suppress(Exception):  # not a checkpoint's plan: nothing held
                    jdf.queryExecution().logical().rdd().unpersist(False)
        self.frames = self.tables = None


def snapshot_base(meta: Mapping[str, Any], batch_id: int) -> int:
    """The batch of the snapshot that the commit ``meta`` of ``batch_id`` builds on: its
    own, for a snapshot or an older format's whole state. O(1)."""
    entry = meta.get("state") or {}
    return int(entry["base"]) if entry.get("kind") == "changelog" else batch_id


class StateStore:
    """The carried state after each batch, and the commits that make it count.

    ``state/N/A/`` holds batch ``N``'s next state as attempt ``A`` wrote it;
    the commit of ``N`` (its metadata, in the chain of slots the module doc
    describes) names the attempt that counts. Checkpoints of format 2 kept
    the state in ``state/N/`` and the commit in ``commits/N.json``; those of
    format 1 kept the metadata in ``state/N/meta.json`` (renamed into
    place): both are read as committed. With an ``owner``, every commit
    checks its fencing token first and is fenced (:meth:`fence`).
    """

    def __init__(self, root: str, storage: Storage, owner: CheckpointOwner | None = None) -> None:
        """O(1): nothing is read or made until asked."""
        self.root, self.storage, self.owner = root, storage, owner
        #: The state the last batch this process committed left (:mod:`.resident`).
        self.resident: ResidentState | None = None
        #: K: every K-th commit after a snapshot writes the whole state (:mod:`.resident`).
        self.snapshot_every = snapshot_every()
        self.state = join(root, "state")
        #: The commits read so far, by batch id (:meth:`_resolve`).
        self._known: dict[int, tuple[dict[str, Any], str, dict[str, Any] | None]] = {}
        self.commits = join(root, "commits")
        self.plans = join(root, "plans")

    def __getstate__(self) -> dict[str, Any]:
        """What a copy in another process gets: no resident state, which stays here."""
        return {**self.__dict__, "resident": None}

    @property
    def token(self) -> int | None:
        """The owner's fencing token (None without an owner). O(1)."""
        return self.owner.token if self.owner is not None else None

    def _slot_ids(self) -> dict[int, int]:
        """How many commit slot files each batch id has (``N.json``, ``N.T.json``).
        One listing."""
        found: dict[int, int] = {}
        names = self.storage.list_names(self.commits)
        for name in names:
            parts = name[:-5].split(".") if name.endswith(".json") else []
            if parts and len(parts) <= 2 and all(p.isdigit() for p in parts):
                found[int(parts[0])] = found.get(int(parts[0]), 0) + 1
        listed = set(names)  # a commit pruned since it was read is gone: forget it
        for batch_id, (_commit, path, _fence) in list(self._known.items()):
            if path.rsplit("/", 1)[-1] not in listed:
                del self._known[batch_id]
        return found

    def _resolve(self, batch_id: int) -> tuple[dict[str, Any] | None, str, dict[str, Any] | None]:
        """Follow batch ``batch_id``'s chain of commit slots: (its commit, or None; the
        commit's slot, or the free one; the last fence passed). O(chain) reads, none
        for a commit seen before: a commit file never changes once made."""
        known = self._known.get(batch_id)
        if known is not None:
            return known
        path, fence = self._commit_path(batch_id), None
        while True:
            try:
                content = read_json(self.storage, path)
            except FileNotFoundError:
                return None, path, fence
            except ValueError as exc:
                raise ValueError(f"the commit of batch {batch_id} cannot be read: {exc}") from None
            if not content.get("fence"):
                self._known[batch_id] = (content, path, fence)
                return content, path, fence
            fence = content
            path = join(self.commits, f"{batch_id}.{int(content['token'])}.json")

    def committed(self) -> list[int]:
        """The committed batch ids in order. One listing, and a read of each batch's
        commit slots: those :meth:`prune` keeps, two batches' and the fences."""
        slots = self._slot_ids()
        ids = {b for b in slots if self._resolve(b)[0] is not None}
        for name in self.storage.list_names(self.state):  # format 1: no commits/
            legacy = name.isdigit() and int(name) not in ids and int(name) not in slots
            if legacy and self.storage.exists(join(self.state, name, "meta.json")):
                ids.add(int(name))
        return sorted(ids)

    def is_committed(self, batch_id: int) -> bool:
        """Whether batch ``batch_id`` committed. O(chain) reads."""
        return self._resolve(batch_id)[0] is not None or self.storage.exists(
            join(self.path(batch_id), "meta.json")
        )

    def meta(self, batch_id: int) -> dict[str, Any]:
        """The metadata committed with batch ``batch_id`` (FileNotFoundError if it did
        not commit). O(chain) reads."""
        commit = self._resolve(batch_id)[0]
        if commit is not None:
            return commit
        return read_json(self.storage, join(self.path(batch_id), "meta.json"))

    def _commit_path(self, batch_id: int) -> str:
        return join(self.commits, f"{batch_id}.json")

    def path(self, batch_id: int) -> str:
        """Batch ``batch_id``'s directory of states (format 2: its state). O(1)."""
        return join(self.state, str(batch_id))

    def attempt_path(self, batch_id: int, attempt: Attempt) -> str:
        """Where ``attempt`` writes batch ``batch_id``'s next state. O(1)."""
        return join(self.path(batch_id), attempt.tag)

    def _is_fence(self, name: str) -> bool:
        """Whether the commit slot file ``name`` holds a fence. One read."""
        with contextlib.suppress(OSError, ValueError):
            return bool(read_json(self.storage, join(self.commits, name)).get("fence"))
        return False

    def state_path(self, batch_id: int, meta: Mapping[str, Any] | None = None) -> str:
        """Where committed batch ``batch_id``'s state is: the attempt its commit
        (``meta``, read if not given) names. O(1) with ``meta``."""
        if meta is None:
            meta = self.meta(batch_id)
        attempt = meta.get("attempt")
        return self.path(batch_id) if attempt is None else join(self.path(batch_id), attempt)

    def latest_before(self, batch_id: int) -> int | None:
        """The newest committed batch before ``batch_id``. O(batches kept)."""
        ids = [b for b in self.committed() if b < batch_id]
        return ids[-1] if ids else None

    def plan(self, batch_id: int, make: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """The write-ahead plan of a batch: made once, reused when the batch replays.

        The first attempt's plan holds for every attempt of the batch, whoever's
        (it says what the batch is, as Spark's offset log does, not what it
        made), so that all of them decide alike."""
        path = join(self.plans, f"{batch_id}.json")
        with contextlib.suppress(FileNotFoundError):
            return read_json(self.storage, path)
        plan = make()
        try:
            create_json(self.storage, path, plan)
        except FileExistsError:  # made meanwhile by an attempt we never heard of
            return read_json(self.storage, path)
        return plan

    def check_owner(self) -> None:
        """:class:`CheckpointFenced` if a newer owner took the checkpoint over (nothing
        without an owner). O(owners)."""
        if self.owner is not None:
            self.owner.check()

    def owns(self) -> bool:
        """Whether this store's owner is still the newest (True without an owner): only
        the owner cleans. O(owners)."""
        try:
            self.check_owner()
        except StreamError:
            return False
        return True

    def _stamp(self) -> dict[str, Any]:
        """What every commit and fence records of its writer. O(1)."""
        from ... import __version__

        return {
            "owner_token": self.token,
            "host": socket.gethostname(),
            "format": STATE_FORMAT,
            "tickwheel": __version__,
        }

    def _create_fence(self, path: str) -> None:
        """This owner's fence, a new file at the free slot ``path`` (FileExistsError if
        a commit or another fence came first). O(1) calls."""
        create_json(self.storage, path, {"fence": True, "token": self.token, **self._stamp()})

    def _fenced(self, token: int, host: str | None) -> CheckpointFenced:
        if self.owner is not None:
            return self.owner.fenced_by(token, host)
        return CheckpointFenced(_checkpoint_of(self.root), self.token, token, host)

    def _claim(self, batch_id: int) -> str:
        """The slot of batch ``batch_id`` this owner may commit in, fencing a slot an
        older owner fenced (:class:`CheckpointFenced` if a newer one did, or if the
        batch is committed already: only a newer owner commits past our fence).
        O(chain) reads."""
        while True:
            commit, path, fence = self._resolve(batch_id)
            if commit is not None:
                by = commit.get("owner_token")
                if isinstance(by, int) and self.token is not None and by > self.token:
                    raise self._fenced(by, commit.get("host"))
                raise StreamError(f"checkpoint {_checkpoint_of(self.root)}: batch "
                                  f"{batch_id} is committed already")  # fmt: skip
            if fence is None or self.token is None or fence["token"] == self.token:
                return path
            if fence["token"] > self.token:
                raise self._fenced(int(fence["token"]), fence.get("host"))
            with contextlib.suppress(FileExistsError):  # an older owner's fence: ours on it
                self._create_fence(path)

    def fence(self) -> int:
        """Fence the first batch not committed, which a predecessor that froze may still
        be running, so that it can never commit (see the module doc); its id. A new
        owner calls it once, before any batch. O(batches kept) reads."""
        assert self.token is not None, "fencing needs an owner's token"
        committed = self.committed()
        batch_id = committed[-1] + 1 if committed else 0
        while True:
            commit, path, fence = self._resolve(batch_id)
            if commit is not None:  # committed by a predecessor meanwhile: it stands
                batch_id += 1
                continue
            if fence is not None and fence["token"] >= self.token:
                if fence["token"] == self.token:
                    return batch_id
                raise self._fenced(int(fence["token"]), fence.get("host"))
            try:
                self._create_fence(path)
            except FileExistsError:  # a commit or a fence came first: look again
                continue
            return batch_id

    def commit(self, batch_id: int, meta: Mapping[str, Any]) -> dict[str, Any]:
        """Commit batch ``batch_id``: one new file in its slot (:meth:`_claim`), after
        the owner's check. It records the owner's token and host, the state format,
        the release and the time besides ``meta`` (which names the attempt); the
        record is returned. :class:`CheckpointFenced` if a newer owner took over."""
        self.check_owner()
        record = {**meta, **self._stamp(), "committed_at_ms": int(time.time() * 1000)}
        while True:
            path = self._claim(batch_id)
            try:
                create_json(self.storage, path, record)
            except FileExistsError:  # a fence or a commit came first: look again
                continue
            return record

    def check_format(self) -> None:
        """Refuse (:class:`StreamError`) a checkpoint whose last commit, or a fence past
        it, is in a state format newer than this release reads. O(1) calls."""
        from ... import __version__

        committed = self.committed()
        records = [self.meta(committed[-1])] if committed else []
        newest = max(self._slot_ids(), default=None)
        if newest is not None and newest not in committed:  # a fence past the last commit
            records.append(self._resolve(newest)[2] or {})
        for meta in records:
            found = meta.get("format", 1)
            if isinstance(found, int) and found <= STATE_FORMAT:
                continue
            raise StreamError(
                f"checkpoint {_checkpoint_of(self.root)}: its state is in format {found!r}, "
                f"written by tickwheel {meta.get('tickwheel', '?')}; tickwheel {__version__} "
                f"reads formats 1 to {STATE_FORMAT}. Run a release that reads it (the one that "
                "wrote it, or newer), or start a new checkpoint"
            )

    def prune(self, batch_id: int, meta: Mapping[str, Any]) -> None:
        """After the commit ``meta`` of ``batch_id``: drop what no commit will read.

        Kept: the states of ``batch_id`` and of the committed batch before it,
        with what each is rebuilt from (the snapshot its changelogs follow, and
        the changelogs between), and every fence: a predecessor that froze
        between its owner check and its commit would otherwise find its batch's
        first slot free again.
        Dropped: older states, commits and plans, and the other attempts'
        states of ``batch_id`` (crashed or fenced ones: its commit names one).
        Only committed batches are touched, so an attempt still running (one
        that will be fenced) loses nothing a commit names. O(batches kept).
        """
        keep = snapshot_base(meta, batch_id)
        before = self.latest_before(batch_id)
        if before is not None:
            keep = min(keep, snapshot_base(self.meta(before), before))
        for name in self.storage.list_names(self.state):
            if name.isdigit() and int(name) < keep:
                self.storage.delete(join(self.state, name))
        for name in self.storage.list_names(self.commits):
            stem = name.split(".")[0]
            if stem.isdigit() and int(stem) < keep and not self._is_fence(name):
                self.storage.delete(join(self.commits, name))
        for name in self.storage.list_names(self.plans):
            stem = name.split(".")[0]
            if stem.isdigit() and int(stem) < batch_id:
                self.storage.delete(join(self.plans, name))
        named = meta.get("attempt")
        if named is not None:
            for name in self.storage.list_names(self.path(batch_id)):
                if name != named and not name.startswith("."):
                    self.storage.delete(join(self.path(batch_id), name))

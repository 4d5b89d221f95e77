"""The stream's checkpoint: its owner, its state, its commits, and fault injection.

``CK/tickwheel/`` is kept through :mod:`..storage`, so it may be a local path
or any URI Spark writes (``hdfs://``, ``s3a://``, ``abfss://``...)::

    LOCK                  a local checkpoint's flock (the kernel drops it if we die)
    owners/T.json         the job holding the checkpoint, with its fencing token T
    owners/T.alive-K      its heartbeat (a URI checkpoint), owners/T.released its end
    plans/N.json          micro-batch N's write-ahead plan, made once
    state/N/              the carried state after batch N (events/, ops/)
    commits/N.json        the commit of batch N: its watermark, counts, state rows, and
                          the rules, input format, state format and release it was made with

Every file is created once, under a name that did not exist, and seen whole
or not at all (:meth:`~..storage.Storage.create`); no directory is renamed and
no file a reader may see is overwritten, which an object store could not do
in one step. Batch ``N`` is committed when, and only when, ``commits/N.json``
exists: ``state/N/`` without it is what a failed attempt left, which readers
ignore and the next attempt deletes before it writes again. Each commit first
checks that its job's token is still the newest (:meth:`CheckpointOwner.check`),
so a job that lost the checkpoint to another never commits over it.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as dt
import fcntl
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..rules import format_duration
from ..storage import Storage, create_json, is_uri, join, read_json

__all__ = [
    "FAULT_ENV",
    "FAULT_LOG_ENV",
    "FAULT_POINTS",
    "HEARTBEAT_ENV",
    "STATE_FORMAT",
    "CheckpointInUse",
    "CheckpointOwner",
    "StateStore",
    "StreamError",
    "fault",
    "owner_holding",
]

logger = logging.getLogger(__name__)

FAULT_ENV = "TICKWHEEL_FAULT"
FAULT_LOG_ENV = "TICKWHEEL_FAULT_LOG"
#: Seconds between an owner's heartbeats on a URI checkpoint (default 10).
HEARTBEAT_ENV = "TICKWHEEL_OWNER_HEARTBEAT_S"
#: Heartbeats an owner on another host may miss before it counts as gone.
MISSED_BEATS = 3
#: Where ``TICKWHEEL_FAULT=POINT:BATCH`` can kill the driver, in batch order.
FAULT_POINTS = (
    "batch_start",  # before anything of the batch is written
    "mid_batch",  # after some outputs were staged, before the others
    "after_outputs",  # all outputs staged, next state maybe half-written
    "after_state",  # outputs and next state staged, nothing committed
    "after_sink_commit",  # sink committed, checkpoint state not
    "after_commit",  # state committed, Spark's own commit log not yet
)


#: The version of the state's format that this release writes. It reads every
#: earlier one: 1, the layout without ``commits/`` (``state/N/meta.json``); 2, the
#: commit files, which record the rules, the input format and the release.
STATE_FORMAT = 2


class StreamError(RuntimeError):
    """The stream cannot run (bad options, inconsistent checkpoint)."""


class CheckpointInUse(StreamError):
    """Another job holds the checkpoint's lock."""


def fault(point: str, batch_id: int) -> None:
    """Kill this process with SIGKILL if ``TICKWHEEL_FAULT`` is ``point:batch_id`` (tests).

    The process is the one that runs ``foreachBatch``: the driver on a classic
    session, the Python process beside the server under Spark Connect, whose
    standard error reaches the client only through the server's log, if at
    all; so the message also goes to the file ``TICKWHEEL_FAULT_LOG`` names.
    """
    spec = os.environ.get(FAULT_ENV)
    if spec and spec == f"{point}:{batch_id}":
        message = f"tickwheel: fault injection: SIGKILL at {point} of batch {batch_id}\n"
        logger.critical("%s", message.rstrip("\n"))
        log = os.environ.get(FAULT_LOG_ENV)
        if log:
            with open(log, "a", encoding="utf-8") as fh:
                fh.write(message)
                fh.flush()
                os.fsync(fh.fileno())
        os.kill(os.getpid(), signal.SIGKILL)


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
        """Raise :class:`StreamError` if a newer job took the checkpoint over. O(owners)."""
        tokens, _ = self._tokens()
        if self.token is None or (tokens and tokens[-1] != self.token):
            fenced = StreamError(
                f"checkpoint {_checkpoint_of(self.root)}: another job took it over (owner token "
                f"{tokens[-1] if tokens else None}, ours {self.token}); this job stops without "
                "committing"
            )
            logger.warning("%s", fenced)
            raise fenced

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


class StateStore:
    """The carried state after each batch, and the commits that make it count.

    ``state/N/`` holds batch ``N``'s next state; ``commits/N.json`` (its
    metadata) makes it the committed one. Checkpoints written before this
    layout kept the metadata in ``state/N/meta.json`` (renamed into place);
    they are read as committed. With an ``owner``, every commit checks its
    fencing token first.
    """

    def __init__(self, root: str, storage: Storage, owner: CheckpointOwner | None = None) -> None:
        """O(1): nothing is read or made until asked."""
        self.root, self.storage, self.owner = root, storage, owner
        self.state = join(root, "state")
        self.commits = join(root, "commits")
        self.plans = join(root, "plans")

    def __getstate__(self) -> dict[str, Any]:
        """Shipped without its owner (Spark Connect's foreachBatch process): the client
        holds the checkpoint. O(1)."""
        return {**self.__dict__, "owner": None}

    def committed(self) -> list[int]:
        """The committed batch ids in order. O(batches kept)."""
        ids = {
            int(n[:-5])
            for n in self.storage.list_names(self.commits)
            if n.endswith(".json") and n[:-5].isdigit()
        }
        for name in self.storage.list_names(self.state):  # the layout before commits/
            legacy = name.isdigit() and int(name) not in ids
            if legacy and self.storage.exists(join(self.state, name, "meta.json")):
                ids.add(int(name))
        return sorted(ids)

    def is_committed(self, batch_id: int) -> bool:
        """Whether batch ``batch_id`` committed. O(1) calls."""
        return self.storage.exists(self._commit_path(batch_id)) or self.storage.exists(
            join(self.path(batch_id), "meta.json")
        )

    def meta(self, batch_id: int) -> dict[str, Any]:
        """The metadata committed with batch ``batch_id``. O(1) calls."""
        try:
            return read_json(self.storage, self._commit_path(batch_id))
        except FileNotFoundError:
            return read_json(self.storage, join(self.path(batch_id), "meta.json"))

    def _commit_path(self, batch_id: int) -> str:
        return join(self.commits, f"{batch_id}.json")

    def path(self, batch_id: int) -> str:
        """Where batch ``batch_id``'s next state is written. O(1)."""
        return join(self.state, str(batch_id))

    def latest_before(self, batch_id: int) -> int | None:
        """The newest committed batch before ``batch_id``. O(batches kept)."""
        ids = [b for b in self.committed() if b < batch_id]
        return ids[-1] if ids else None

    def plan(self, batch_id: int, make: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """The write-ahead plan of a batch: made once, reused when the batch replays."""
        path = join(self.plans, f"{batch_id}.json")
        with contextlib.suppress(FileNotFoundError):
            return read_json(self.storage, path)
        plan = make()
        try:
            create_json(self.storage, path, plan)
        except FileExistsError:  # made meanwhile by an attempt we never heard of
            return read_json(self.storage, path)
        return plan

    def begin(self, batch_id: int) -> str:
        """Clear what a failed attempt of uncommitted ``batch_id`` left; its state path."""
        path = self.path(batch_id)
        self.storage.delete(path)
        return path

    def commit(self, batch_id: int, meta: Mapping[str, Any]) -> None:
        """Commit batch ``batch_id``: one new file, ``commits/N.json``, after the fencing
        check. It records the state format, the release and the time besides ``meta``."""
        from ... import __version__

        if self.owner is not None:
            self.owner.check()
        create_json(self.storage, self._commit_path(batch_id), {
            **meta,
            "owner_token": self.owner.token if self.owner else None,
            "format": STATE_FORMAT,
            "tickwheel": __version__,
            "committed_at_ms": int(time.time() * 1000),
        })  # fmt: skip

    def check_format(self) -> None:
        """Refuse (:class:`StreamError`) a checkpoint whose last commit is in a state format
        newer than this release reads. O(1) calls."""
        from ... import __version__

        committed = self.committed()
        if not committed:
            return
        meta = self.meta(committed[-1])
        found = meta.get("format", 1)
        if not isinstance(found, int) or found > STATE_FORMAT:
            raise StreamError(
                f"checkpoint {_checkpoint_of(self.root)}: its state is in format {found!r}, "
                f"written by tickwheel {meta.get('tickwheel', '?')}; tickwheel {__version__} "
                f"reads formats 1 to {STATE_FORMAT}. Run a release that reads it (the one that "
                "wrote it, or newer), or start a new checkpoint"
            )

    def prune(self, batch_id: int) -> None:
        """Keep the state of ``batch_id`` and the one before it; drop older states, their
        commits, leftovers of failed attempts and older plans. O(batches kept)."""
        keep = min(b for b in (batch_id, self.latest_before(batch_id)) if b is not None)
        for name in self.storage.list_names(self.state):
            if name.isdigit() and int(name) < keep:
                self.storage.delete(join(self.state, name))
        for name in self.storage.list_names(self.commits):
            stem = name.split(".")[0]
            if stem.isdigit() and int(stem) < keep:
                self.storage.delete(join(self.commits, name))
        for name in self.storage.list_names(self.plans):
            stem = name.split(".")[0]
            if stem.isdigit() and int(stem) < batch_id:
                self.storage.delete(join(self.plans, name))

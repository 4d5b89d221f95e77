"""Who may write a checkpoint: the owner's fencing token, its flock or heartbeat, and
whether an earlier owner is still alive. How ownership and fencing work together is
told once, in ``docs/pipeline-design.md``, "Concurrency and faults"."""

from __future__ import annotations

import atexit
import contextlib
import datetime as dt
import fcntl
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from ...rules import format_duration
from ...storage import Storage, create_json, is_uri, join, read_json
from .errors import CheckpointFenced, CheckpointInUse, StreamError
from .paths import checkpoint_of

__all__ = ["HEARTBEAT_ENV", "MISSED_BEATS", "CheckpointOwner", "owner_holding", "pid_alive"]

logger = logging.getLogger(__name__)

#: Seconds between an owner's heartbeats on a URI checkpoint (default 10).
HEARTBEAT_ENV = "TICKWHEEL_OWNER_HEARTBEAT_S"
#: Heartbeats an owner on another host may miss before it counts as gone.
MISSED_BEATS = 3


class CheckpointOwner:
    """The one job that may write a checkpoint: a fencing token, and on a local path a flock.

    :meth:`acquire` refuses (:class:`CheckpointInUse`) while an earlier owner
    is alive (:func:`owner_holding`), and otherwise creates ``owners/T.json``
    with a token ``T`` one above every earlier one; :meth:`check` raises
    :class:`CheckpointFenced` once a newer token exists. Pickled (Spark Connect
    ships the state store to the process that runs ``foreachBatch``), an owner
    carries its token and host, not its lock or heartbeat, which stay with the
    job that took it.

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
            f"checkpoint {checkpoint_of(self.root)} is in use by {self._describe(info)}; two "
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
            raise StreamError(f"checkpoint {checkpoint_of(self.root)}: this job holds no "
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
        fenced = CheckpointFenced(checkpoint_of(self.root), self.token, token, host)
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

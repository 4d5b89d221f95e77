"""The stream's checkpoint: its lock, its state directories, and fault injection.

``CK/tickwheel/`` holds ``LOCK`` and ``owner.json`` (:class:`CheckpointLock`),
``state/N`` (the carried state after batch ``N``), ``staging/N`` (the next
state being written) and ``plans/N.json`` (a batch's write-ahead plan), all
kept by :class:`StateStore`. Files are written to a temporary name, fsynced
and renamed, so a crash leaves either the old file or the new one.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import shutil
import signal
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

from ..durable import fsync_dir, read_json, write_json

__all__ = [
    "FAULT_ENV",
    "FAULT_LOG_ENV",
    "FAULT_POINTS",
    "CheckpointInUse",
    "CheckpointLock",
    "StateStore",
    "StreamError",
    "fault",
]

FAULT_ENV = "TICKWHEEL_FAULT"
FAULT_LOG_ENV = "TICKWHEEL_FAULT_LOG"
#: Where ``TICKWHEEL_FAULT=POINT:BATCH`` can kill the driver, in batch order.
FAULT_POINTS = (
    "batch_start",  # before anything of the batch is written
    "mid_batch",  # after some outputs were staged, before the others
    "after_outputs",  # all outputs staged, next state maybe half-written
    "after_state",  # outputs and next state staged, nothing committed
    "after_sink_commit",  # sink committed, checkpoint state not
    "after_commit",  # state committed, Spark's own commit log not yet
)


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
        sys.stderr.write(message)
        sys.stderr.flush()
        log = os.environ.get(FAULT_LOG_ENV)
        if log:
            with open(log, "a", encoding="utf-8") as fh:
                fh.write(message)
                fh.flush()
                os.fsync(fh.fileno())
        os.kill(os.getpid(), signal.SIGKILL)


class CheckpointLock:
    """An exclusive ``flock`` on ``CK/tickwheel/LOCK``; the kernel drops it if we die."""

    def __init__(self, root: str) -> None:
        self.path = os.path.join(root, "LOCK")
        self.owner = os.path.join(root, "owner.json")
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            who = "another job"
            with contextlib.suppress(OSError, ValueError), open(self.owner, encoding="utf-8") as fh:
                info = json.load(fh)
                who = f"job pid {info.get('pid')} on {info.get('host')} since {info.get('since')}"
            raise CheckpointInUse(
                f"checkpoint {os.path.dirname(os.path.dirname(self.path))} is in use by {who}; "
                "two jobs on one checkpoint would corrupt it. Stop the other job or use "
                "another --checkpoint."
            ) from None
        self._fd = fd

    def write_owner(self, jvm_pid: int | None) -> None:
        previous = None
        with contextlib.suppress(OSError, ValueError), open(self.owner, encoding="utf-8") as fh:
            previous = json.load(fh)
        info = {
            "pid": os.getpid(),
            "jvm_pid": jvm_pid,
            "host": socket.gethostname(),
            "since": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        }
        write_json(self.owner, info)
        # A previous driver killed with SIGKILL leaves its JVM to notice that its
        # parent is gone; wait for it, so two JVMs never write the checkpoint.
        if previous and previous.get("host") == info["host"]:
            old = previous.get("jvm_pid")
            if isinstance(old, int) and old != jvm_pid:
                _wait_gone(old, 60.0)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


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
    """``CK/tickwheel/state/N`` directories: the carried state after each batch."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.state = os.path.join(root, "state")
        self.staging = os.path.join(root, "staging")
        self.plans = os.path.join(root, "plans")
        for path in (self.state, self.staging, self.plans):
            os.makedirs(path, exist_ok=True)

    def committed(self) -> list[int]:
        return sorted(int(n) for n in os.listdir(self.state) if n.isdigit())

    def path(self, batch_id: int) -> str:
        return os.path.join(self.state, str(batch_id))

    def staged(self, batch_id: int) -> str:
        return os.path.join(self.staging, str(batch_id))

    def latest_before(self, batch_id: int) -> int | None:
        ids = [b for b in self.committed() if b < batch_id]
        return ids[-1] if ids else None

    def plan(self, batch_id: int, make: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        """The write-ahead plan of a batch: made once, reused when the batch replays."""
        path = os.path.join(self.plans, f"{batch_id}.json")
        if os.path.exists(path):
            return read_json(path)
        plan = make()
        write_json(path, plan)
        return plan

    def commit(self, batch_id: int) -> None:
        os.rename(self.staged(batch_id), self.path(batch_id))
        fsync_dir(self.state)

    def prune(self, batch_id: int) -> None:
        """Keep the state of ``batch_id`` and the one before it; drop older ones."""
        keep = {batch_id, self.latest_before(batch_id)}
        for b in self.committed():
            if b not in keep and b < batch_id:
                shutil.rmtree(self.path(b), ignore_errors=True)
        for name in os.listdir(self.plans):
            stem = name.split(".")[0]
            if stem.isdigit() and int(stem) < batch_id:
                with contextlib.suppress(OSError):
                    os.remove(os.path.join(self.plans, name))

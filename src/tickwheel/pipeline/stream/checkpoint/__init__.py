"""The stream's checkpoint: who owns it, its commit log, and the tests' fault points.

``CK/tickwheel/`` is kept through :mod:`...storage`, so it may be a local path
or any URI Spark writes (``hdfs://``, ``s3a://``, ``abfss://``...); Spark's own
checkpoint is beside it, in ``CK/spark/`` (:mod:`.paths`)::

    LOCK                  a local checkpoint's flock (the kernel drops it if we die)
    owners/T.json         the job holding the checkpoint, with its fencing token T
    owners/T.alive-K      its heartbeat (a URI checkpoint), owners/T.released its end
    plans/N.json          micro-batch N's write-ahead plan, made once
    state/N/A/            the carried state after batch N as attempt A wrote it: whole
                          (events/, ops/) or as its changes (ops.added/, ...)
    commits/N.json        the commit of batch N (:class:`~.record.Commit`): the
                          attempt whose state and outputs count, and what it left
    commits/N.T.json      the same, where a fence by owner T holds N.json

Every file is created once and never overwritten; batch ``N`` is committed
when, and only when, its commit file exists. The protocol (the steps of a
micro-batch, fencing, what a crash at each point leaves) is told once, in
``docs/pipeline-design.md``: "Commit protocol (exactly once)" and
"Concurrency and faults".

By concern: :mod:`.errors`; :mod:`.faults` (a test hook); :mod:`.owner`
(tokens, flock, heartbeats, liveness); :mod:`.record` (the typed records and
the state format); :mod:`.commits` (:class:`StateStore`, the commit log).
"""

from __future__ import annotations

from ...attempt import Attempt
from .commits import StateStore, new_plan, take_checkpoint
from .errors import CheckpointFenced, CheckpointInUse, StreamError
from .faults import FAULT_ENV, FAULT_LOG_ENV, FAULT_POINTS, fault
from .owner import HEARTBEAT_ENV, CheckpointOwner, owner_holding, pid_alive
from .paths import checkpoint_of, spark_checkpoint, tickwheel_root
from .record import STATE_FORMAT, Commit, Fence, Stamp, StateEntry

__all__ = [
    "FAULT_ENV",
    "FAULT_LOG_ENV",
    "FAULT_POINTS",
    "HEARTBEAT_ENV",
    "STATE_FORMAT",
    "Attempt",
    "CheckpointFenced",
    "CheckpointInUse",
    "CheckpointOwner",
    "Commit",
    "Fence",
    "Stamp",
    "StateEntry",
    "StateStore",
    "StreamError",
    "checkpoint_of",
    "fault",
    "new_plan",
    "owner_holding",
    "pid_alive",
    "spark_checkpoint",
    "take_checkpoint",
    "tickwheel_root",
]

"""Fault injection, a test hook: ``TICKWHEEL_FAULT=POINT:BATCH`` stops the process that runs
``foreachBatch`` at one point of the commit protocol (``docs/pipeline-design.md``,
"Concurrency and faults"). Unset, :func:`fault` returns at once."""

from __future__ import annotations

import logging
import os
import signal

__all__ = ["FAULT_ENV", "FAULT_LOG_ENV", "FAULT_POINTS", "fault"]

logger = logging.getLogger(__name__)

FAULT_ENV = "TICKWHEEL_FAULT"
FAULT_LOG_ENV = "TICKWHEEL_FAULT_LOG"
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

"""DelayedFuturePurgatory: wait for a set of futures, or time out (Kafka's ``DelayedFuture``).

Kafka uses it for admin requests (create topics, delete records) that wait on
``CompletableFuture``s. Here the futures are ``concurrent.futures.Future``s:
the delayed op completes when all of them are done, or, at the timeout, fails
the ones still pending with the built-in :class:`TimeoutError`. Either way the
callback runs exactly once, after the futures are settled.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Iterable
from typing import Any

from ._purgatory import DelayedOperation, DelayedOperationPurgatory
from ._timer import SystemTimer

__all__ = ["DelayedFuture", "DelayedFuturePurgatory"]


class DelayedFuture(DelayedOperation):
    """A delayed op over ``futures``: completes once all are done, or expires after ``timeout_ms``.

    On completion (either way) the futures still pending fail with
    ``TimeoutError("... timed out after <timeout_ms> ms")``, then ``callback()`` runs.
    """

    __slots__ = ("_callback", "_futures")

    def __init__(
        self,
        timeout_ms: int,
        futures: list[concurrent.futures.Future[Any]],
        callback: Callable[[], object],
    ) -> None:
        super().__init__(timeout_ms)
        self._futures = futures
        self._callback = callback

    @property
    def futures(self) -> list[concurrent.futures.Future[Any]]:
        """The futures this op waits for. O(1)."""
        return self._futures

    def try_complete(self) -> bool:
        """Complete the op if every future is done. O(futures)."""
        for future in self._futures:
            if not future.done():
                return False
        return self.force_complete()

    def on_complete(self) -> None:
        """Fail the futures still pending with TimeoutError, then run the callback once."""
        for future in self._futures:
            if not future.done():
                # If it completed meanwhile, it keeps its own result.
                with contextlib.suppress(concurrent.futures.InvalidStateError):
                    future.set_exception(
                        TimeoutError(f"request timed out after {self._delay_ms} ms")
                    )
        self._callback()


class DelayedFuturePurgatory:
    """Kafka's ``DelayedFuturePurgatory``: a purgatory of :class:`DelayedFuture` ops.

    All ops watch one private key. When the futures of an op complete later, the
    last one to finish hands ``force_complete`` to this purgatory's executor,
    one thread named ``DelayedExecutor-<name>``, created only when first needed.

    ``timer`` and ``reaper_enabled`` are passed to the underlying
    :class:`~tickwheel.DelayedOperationPurgatory` (deterministic tests pass a
    timer on a ManualClock with ``reaper_enabled=False``).
    """

    def __init__(
        self,
        name: str,
        *,
        timer: SystemTimer | None = None,
        reaper_enabled: bool = True,
    ) -> None:
        self.name = name
        self.purgatory: DelayedOperationPurgatory[DelayedFuture] = DelayedOperationPurgatory(
            name, timer=timer, reaper_enabled=reaper_enabled
        )
        self._key = object()
        self._lock = threading.Lock()
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._shutdown = False

    def try_complete_else_watch(
        self,
        timeout_ms: int,
        futures: Iterable[concurrent.futures.Future[Any]],
        callback: Callable[[], object],
    ) -> DelayedFuture:
        """Complete at once if all ``futures`` are done, else when they are or at ``timeout_ms``.

        Already-done futures complete the op in the calling thread, with no
        executor thread. Otherwise the op completes on the executor thread when
        the last future finishes, or on the timer's thread when it expires.
        ``callback`` runs exactly once. Returns the op. O(futures).
        """
        futures = list(futures)
        for future in futures:
            if not isinstance(future, concurrent.futures.Future):
                raise TypeError(f"futures must be concurrent.futures.Future, got {future!r}")
        if not callable(callback):
            raise TypeError(f"callback must be callable, got {callback!r}")
        op = DelayedFuture(timeout_ms, futures, callback)
        if self.purgatory.try_complete_else_watch(op, (self._key,)):
            return op
        pending = [future for future in futures if not future.done()]
        if not pending:
            # Done between the check and now: complete here, still without a thread.
            op.force_complete()
            return op
        remaining = [len(pending)]
        count_lock = threading.Lock()

        def one_done(_: concurrent.futures.Future[Any]) -> None:
            with count_lock:
                remaining[0] -= 1
                last = remaining[0] == 0
            if last and not op._state:
                self._submit(op)

        for future in pending:
            future.add_done_callback(one_done)
        return op

    def _submit(self, op: DelayedFuture) -> None:
        """Run ``force_complete`` of ``op`` on the executor thread, creating it if needed."""
        with self._lock:
            if self._shutdown:
                return
            executor = self._executor
            if executor is None:
                executor = self._executor = concurrent.futures.ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix=f"DelayedExecutor-{self.name}"
                )
            # Completed ops leave the watcher list at the reaper's next purge (as in Kafka).
            executor.submit(op.force_complete)

    @property
    def executor_started(self) -> bool:
        """True once the executor thread has been created. O(1)."""
        return self._executor is not None

    @property
    def watched(self) -> int:
        """Watcher entries of the underlying purgatory. O(shards)."""
        return self.purgatory.watched

    @property
    def num_delayed(self) -> int:
        """Ops waiting in the timer. O(1)."""
        return self.purgatory.num_delayed

    @property
    def is_shutdown(self) -> bool:
        """True after :meth:`shutdown`. O(1)."""
        return self._shutdown

    def shutdown(self) -> None:
        """Stop the executor (dropping queued completions) and shut the purgatory down."""
        with self._lock:
            if self._shutdown:
                return
            self._shutdown = True
            executor = self._executor
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
        self.purgatory.shutdown()

    def __enter__(self) -> DelayedFuturePurgatory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

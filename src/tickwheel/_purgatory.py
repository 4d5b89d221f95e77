"""DelayedOperation and DelayedOperationPurgatory: Kafka's purgatory on the timing wheel.

A *delayed operation* is a request that completes when its condition holds or
when its timeout passes, whichever comes first (Kafka's ``DelayedOperation.scala``:
a produce with ``acks=all`` waits for the in-sync replicas, a fetch waits for
``min.bytes``). The *purgatory* keeps each pending operation in two places:

* the **watcher lists**: for each key the operation watches, a list of the
  operations that an event on that key may complete. ``check_and_complete(key)``
  walks that list and tries each one;
* the **timer**: a :class:`~tickwheel.SystemTimer` whose task *is* the operation
  (``DelayedOperation`` subclasses ``TimerTask``), so it expires in O(1).

Ground rules
------------
* **One winner.** ``force_complete()`` flips the operation's state from pending
  to completed exactly once, whoever calls it (a traversal, the expiry path,
  user code), so ``on_complete()`` runs exactly once. The flip happens under one
  module-wide lock held for a few bytecodes (Kafka uses an ``AtomicBoolean``).
* **try_complete runs under op.lock.** Every call of ``try_complete()`` made by
  the purgatory holds ``op.lock``: ``try_complete_else_watch`` goes through
  ``safe_try_complete_or_else``, ``check_and_complete`` through
  ``safe_try_complete``. Several operations may share one lock.
* **Lock order**: ``op.lock`` → shard lock → timer lock. A traversal copies the
  watcher list under the shard lock, releases it, and only then takes each
  op's lock, so the two orders never meet.
* **Lazy removal.** A completed operation stays in the watcher lists of its
  other keys until a traversal of that key or a purge drops it, exactly as in
  Kafka; ``watched`` counts it until then. The reaper purges once the estimated
  number of completed-but-watched operations exceeds ``purge_interval``.

The hot halves, :class:`_DelayedOperationCore` (completion, the safe tries,
the expiry path) and :class:`_PurgatoryCore` (watching, traversals, expiry and
purging), are written here as the readable reference, with Kafka's names;
``tickwheel._speedups`` holds their compiled twins, used when built. The slow
halves (set-up, the reaper, shutdown, inspection) are
:class:`DelayedOperation` and :class:`DelayedOperationPurgatory`, shared by
both paths.
"""

from __future__ import annotations

import logging
import threading
from abc import ABCMeta, abstractmethod
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ._accel import speedups
from ._clock import is_manual
from ._task import TimerTask
from ._timer import SystemTimer

__all__ = ["DelayedOperation", "DelayedOperationPurgatory"]

logger = logging.getLogger("tickwheel")

#: Number of watcher-list shards, each with its own lock (Kafka's ``Shards``).
SHARDS = 512

# States of a DelayedOperation.
_PENDING = 0
_COMPLETED = 1
_CANCELLED = 2

# Makes the pending -> completed/cancelled flip atomic (Kafka's AtomicBoolean
# compareAndSet) and guards the purgatories' completion counters. Held only for
# a few steps, never while user code runs.
_STATE_LOCK = threading.Lock()

T = TypeVar("T", bound="DelayedOperation")


class _DelayedOperationCore(TimerTask):
    """DelayedOperation's hot half: completion, the safe tries and the expiry path.

    Its compiled twin is ``tickwheel._speedups._DelayedOperationCore``; the rest
    of :class:`DelayedOperation` (the methods to override, ``repr``) is shared.
    """

    __slots__ = ("_purgatory", "_state", "lock")

    _purgatory: _PurgatoryCore[Any] | None

    def __init__(self, delay_ms: int, lock: Any = None) -> None:
        super().__init__(delay_ms)
        if lock is None:
            lock = threading.RLock()
        elif not (hasattr(lock, "acquire") and hasattr(lock, "release")):
            raise TypeError(
                f"lock must be a lock with acquire() and release() or None, got {lock!r}"
            )
        self.lock = lock
        self._state = _PENDING
        self._purgatory = None

    # Provided by DelayedOperation: what a subclass overrides.

    def try_complete(self) -> bool:
        raise NotImplementedError

    def on_complete(self) -> None:
        raise NotImplementedError

    def on_expiration(self) -> None:
        raise NotImplementedError

    # -- completion ----------------------------------------------------------------

    def force_complete(self) -> bool:
        """Complete the op if nobody has yet: cancel its timer entry and run ``on_complete()``.

        Returns True only for the single caller that won; every later call (or a
        call after the op was cancelled) returns False and does nothing. O(1)
        plus ``on_complete()``.
        """
        return self._complete(expired=False)

    def _complete(self, expired: bool) -> bool:
        """Flip pending -> completed if nobody has yet, then cancel and run ``on_complete()``.

        The flip counts the op in its purgatory (as expired too when ``expired``),
        in one step. True if this call won.
        """
        with _STATE_LOCK:
            if self._state != _PENDING:
                return False
            self._state = _COMPLETED
            purgatory = self._purgatory
            if purgatory is not None:
                purgatory._num_finished += 1
                if expired:
                    purgatory._num_expired += 1
        self.cancel()
        self.on_complete()
        return True

    @property
    def is_completed(self) -> bool:
        """True once the op has completed (by its condition or by expiring). O(1)."""
        return self._state == _COMPLETED

    def safe_try_complete(self) -> bool:
        """Call :meth:`try_complete` with :attr:`lock` held; return its result."""
        lock = self.lock
        lock.acquire()
        try:
            return self.try_complete()
        finally:
            lock.release()

    def safe_try_complete_or_else(self, action: Callable[[], object]) -> bool:
        """Under :attr:`lock`: try to complete; else run ``action()`` and try once more.

        Kafka's ``safeTryCompleteOrElse``: the purgatory's ``action`` watches the
        keys, so an event that arrives while the op is being watched cannot be missed.
        """
        lock = self.lock
        lock.acquire()
        try:
            if self.try_complete():
                return True
            action()
            return self.try_complete()
        finally:
            lock.release()

    def run(self) -> None:
        """The expiry path, run by the timer: if the op completes now, ``on_expiration()``.

        Kafka's ``run``: ``if (forceComplete()) onExpiration()``. The expiry is
        counted in the same step as the completion, so ``num_completed`` never
        counts an expiring op; an overridden ``force_complete`` is called, and the
        expiry counted after it.
        """
        if type(self).force_complete is _DelayedOperationCore.force_complete:
            completed = self._complete(expired=True)
        else:
            completed = self.force_complete()
            if completed and self._purgatory is not None:
                with _STATE_LOCK:
                    self._purgatory._num_expired += 1
        if completed:
            self.on_expiration()

    def _mark_cancelled(self) -> bool:
        """Flip pending -> cancelled (no completion); True if this call did it."""
        with _STATE_LOCK:
            if self._state != _PENDING:
                return False
            self._state = _CANCELLED
        self.cancel()
        return True


class _WatcherList:
    """One shard: the watchers of the keys hashing to it, under one lock (Kafka's ``WatcherList``).

    ``watchers`` maps a key to what watches it: the op itself while it is the
    only one (no list allocated: the common case of one op per key), else a list
    of ops. A key is never mapped to an empty list. ``count`` is the number of
    entries in all lists. Each method takes the lock.
    """

    __slots__ = ("count", "lock", "watchers")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.watchers: dict[Hashable, _DelayedOperationCore | list[_DelayedOperationCore]] = {}
        self.count = 0

    def watch(self, key: Hashable, op: _DelayedOperationCore) -> None:
        """Add ``op`` to the list of ``key``. O(1)."""
        with self.lock:
            ops = self.watchers.get(key)
            if ops is None:
                self.watchers[key] = op
            elif isinstance(ops, list):
                ops.append(op)
            else:
                self.watchers[key] = [ops, op]
            self.count += 1

    def ops_of(self, key: Hashable) -> Sequence[_DelayedOperationCore]:
        """A copy of the list of ``key`` (empty for an unknown key). O(ops)."""
        with self.lock:
            ops = self.watchers.get(key)
            if ops is None:
                return ()
            return ops.copy() if isinstance(ops, list) else (ops,)

    def drop_done(self, key: Hashable) -> None:
        """Remove the ops of ``key`` that are no longer pending. O(ops)."""
        with self.lock:
            ops = self.watchers.get(key)
            if ops is not None:
                self._keep_pending(key, ops)

    def cancel(self, key: Hashable) -> list[_DelayedOperationCore]:
        """Remove the list of ``key``; return its ops. O(ops)."""
        with self.lock:
            found = self.watchers.pop(key, None)
            if found is None:
                return []
            ops = found if isinstance(found, list) else [found]
            self.count -= len(ops)
            return ops

    def purge(self) -> int:
        """Remove the ops no longer pending from every list; return how many. O(entries)."""
        with self.lock:
            before = self.count
            for key, ops in list(self.watchers.items()):
                self._keep_pending(key, ops)
            return before - self.count

    def _keep_pending(
        self, key: Hashable, ops: _DelayedOperationCore | list[_DelayedOperationCore]
    ) -> None:
        """Drop the ops of ``key`` (which are ``ops``) no longer pending. Caller holds the lock.

        The key goes when none is left; a lone op is stored as is.
        """
        listed = ops if isinstance(ops, list) else [ops]
        kept = [op for op in listed if not op._state]
        if len(kept) == len(listed):
            return
        self.count -= len(listed) - len(kept)
        if not kept:
            del self.watchers[key]
        elif len(kept) == 1:
            self.watchers[key] = kept[0]
        else:
            self.watchers[key] = kept

    def watched_keys(self) -> list[Hashable]:
        """The keys with a list. O(keys)."""
        with self.lock:
            return list(self.watchers)


class _PurgatoryCore(Generic[T]):
    """DelayedOperationPurgatory's hot half: watching, traversals, expiry, purging, counters.

    Its compiled twin is ``tickwheel._speedups._PurgatoryCore``; the rest of
    :class:`DelayedOperationPurgatory` (set-up, the reaper, shutdown) is shared.
    """

    def __init__(self, timer: SystemTimer, purge_interval: int, timer_enabled: bool) -> None:
        self._timer = timer
        # Bound once: the timer's add and advance this purgatory calls.
        self._timer_add = timer.add
        self._timer_advance = timer.advance_clock
        self.purge_interval = purge_interval
        self.timer_enabled = timer_enabled
        self._shards = [_WatcherList() for _ in range(SHARDS)]
        # Kafka's estimatedTotalOperations: ops watched since the last purge plus the
        # ops delayed at that purge. An estimate: concurrent increments may be lost,
        # which at worst delays a purge.
        self._estimated_total = 0
        # Counters, changed under _STATE_LOCK (finished = completed + expired).
        self._num_finished = 0
        self._num_expired = 0
        self._num_cancelled = 0
        self._num_purged = 0
        self._shutdown = False

    # Provided by DelayedOperationPurgatory.
    name: str

    @property
    def timer(self) -> SystemTimer:
        """The timer that expires the ops; set once, at construction."""
        return self._timer

    # -- watching and completing ---------------------------------------------------

    def try_complete_else_watch(self, op: T, keys: Sequence[Hashable]) -> bool:
        """Complete ``op`` now if it can; else watch it on every key and add it to the timer.

        Kafka's double check, under ``op.lock`` (through ``safe_try_complete_or_else``):
        try to complete; else watch each key (stopping once the op has
        completed); then try once more. If the op is still pending, it is added
        to the timer, and cancelled again if it completed meanwhile. Returns True
        if this call completed the op. O(len(keys)) plus ``try_complete``.

        ``keys`` is a non-empty sequence of hashable keys, matched by value. An op
        that is no longer pending is not watched again (returns False).
        """
        _check_keys(keys)
        if self._shutdown:
            raise RuntimeError(f"purgatory {self.name!r} is shut down")
        if op._state:
            return False
        op._purgatory = self
        if op.safe_try_complete_or_else(lambda: self._watch(op, keys)):
            return True
        if not op._state:
            if self.timer_enabled:
                self._timer_add(op)
            if op._state:
                op.cancel()
        return False

    def _watch(self, op: DelayedOperation, keys: Sequence[Hashable]) -> None:
        """Add ``op`` to the watcher list of each key, stopping once it has completed.

        The action between the two tries of ``safe_try_complete_or_else``. O(len(keys)).
        """
        watched = False
        for key in keys:
            if op._state:
                break
            self._shard(key).watch(key, op)
            watched = True
        if watched:
            self._estimated_total += 1

    def _shard(self, key: Hashable) -> _WatcherList:
        """The shard of ``key``. TypeError if the key is not hashable."""
        try:
            return self._shards[hash(key) % SHARDS]
        except TypeError:
            raise TypeError(f"watch key {key!r} is not hashable") from None

    def check_and_complete(self, key: Hashable) -> int:
        """Try to complete every op watched on ``key``; return how many this call completed.

        Each op is tried under its own lock (blocking on it, so no completion is
        lost). Ops found already completed are removed and not counted; a list
        left empty is removed. O(ops watched on key).
        """
        shard = self._shard(key)
        completed = 0
        dirty = False
        for op in shard.ops_of(key):
            if op._state:
                dirty = True
            elif op.safe_try_complete():
                completed += 1
        if dirty or completed:
            shard.drop_done(key)
        return completed

    def cancel_for_key(self, key: Hashable) -> list[T]:
        """Stop watching ``key``: cancel its pending ops (not completed) and return them.

        The ops leave the timer and can no longer complete or expire; they stay
        in the lists of their other keys until a traversal or purge. Ops already
        completed are dropped, not returned (Kafka returns them too). An unknown
        key gives ``[]``. O(ops watched on key).
        """
        cancelled = [op for op in self._shard(key).cancel(key) if op._mark_cancelled()]
        if cancelled:
            with _STATE_LOCK:
                self._num_cancelled += len(cancelled)
        return cancelled  # type: ignore[return-value]

    # -- expiry and purging ----------------------------------------------------------

    def advance_clock(self, timeout_ms: int = 0) -> bool:
        """One reaper step: ``timer.advance_clock(timeout_ms)``, then purge if due.

        The purge runs once (estimated watched ops − ``num_delayed``) exceeds
        ``purge_interval``. Returns what the timer returned (True if a bucket was
        due). O(1) plus the expired ops, plus O(watched) when it purges.
        """
        fired = self._timer_advance(timeout_ms)
        if self._estimated_total - self.timer.size > self.purge_interval:
            self.purge_completed()
        return fired

    def purge_completed(self) -> int:
        """Remove every op that is no longer pending from all watcher lists; return how many.

        Resets the estimate to ``num_delayed`` (as Kafka). O(watched + keys).
        """
        self._estimated_total = self.timer.size
        purged = sum(shard.purge() for shard in self._shards if shard.count)
        if purged:
            with _STATE_LOCK:
                self._num_purged += purged
        return purged

    # -- metrics ----------------------------------------------------------------

    @property
    def watched(self) -> int:
        """Entries across all watcher lists, completed ones included until removed. O(shards)."""
        return sum(shard.count for shard in self._shards)

    @property
    def num_delayed(self) -> int:
        """Ops pending in the timer (the timer's size). O(1)."""
        return self.timer.size

    @property
    def num_completed(self) -> int:
        """Ops of this purgatory completed by their condition (not expired). O(1)."""
        return self._num_finished - self._num_expired

    @property
    def num_expired(self) -> int:
        """Ops of this purgatory that timed out. O(1)."""
        return self._num_expired

    @property
    def num_cancelled(self) -> int:
        """Ops cancelled by :meth:`cancel_for_key`. O(1)."""
        return self._num_cancelled

    @property
    def num_purged(self) -> int:
        """Watcher entries removed by purges so far. O(1)."""
        return self._num_purged


def _check_keys(keys: Sequence[Hashable]) -> None:
    """TypeError for a str or bytes (a key, not keys); ValueError for no keys."""
    if isinstance(keys, (str, bytes)):
        raise TypeError(
            f"keys must be a sequence of keys, not {type(keys).__name__} {keys!r}; "
            "wrap a single key in a list"
        )
    if not keys:
        raise ValueError("keys must not be empty: an op needs at least one watch key")


if not TYPE_CHECKING and speedups is not None:
    from ._speedups import _DelayedOperationCore, _PurgatoryCore


class DelayedOperation(_DelayedOperationCore, metaclass=ABCMeta):
    """An operation that completes when its condition holds or when ``delay_ms`` has passed.

    Kafka's ``DelayedOperation``. Subclasses override:

    * :meth:`try_complete`: check the condition and call :meth:`force_complete`
      when it holds; return what ``force_complete()`` returned (False otherwise);
    * :meth:`on_complete`: runs exactly once, whether the op completed or expired;
    * :meth:`on_expiration` (optional): runs after ``on_complete()`` when the op
      timed out.

    ``lock`` is the lock every purgatory call of ``try_complete()`` holds: a new
    ``threading.RLock`` by default, or one passed in and shared by several ops
    (which saves its allocation; it must be re-entrant if ``try_complete`` may
    run while the caller already holds it). The op is its own timer task, so a
    pending op is one object. A subclass that declares ``__slots__`` keeps it
    small, and lets the compiled core make its own calls of ``cancel`` and
    ``safe_try_complete_or_else`` in C (an op with a ``__dict__`` may carry
    overrides on the instance, so they are looked up as in Python).
    """

    __slots__ = ()

    # -- to override -----------------------------------------------------------

    @abstractmethod
    def try_complete(self) -> bool:
        """Check the condition; when it holds, return what :meth:`force_complete` returns.

        Called with :attr:`lock` held. Must return False when it did not complete the op.
        """

    @abstractmethod
    def on_complete(self) -> None:
        """The op's completion logic; runs exactly once, whether it completed or expired."""

    def on_expiration(self) -> None:
        """Runs after :meth:`on_complete` when the op timed out. Does nothing by default."""

    def __repr__(self) -> str:
        state = ("pending", "completed", "cancelled")[self._state]
        return (
            f"<{type(self).__name__} delay_ms={self._delay_ms} "
            f"expiration_ms={self.expiration_ms} {state}>"
        )


class DelayedOperationPurgatory(_PurgatoryCore[T], Generic[T]):
    """Kafka's ``DelayedOperationPurgatory``: pending ops watched by key and timed out by a timer.

    ``timer``: the :class:`~tickwheel.SystemTimer` that expires the ops. When None,
    the purgatory creates ``SystemTimer(name)`` (system clock, its own executor
    thread). As in Kafka, :meth:`shutdown` closes the timer, whether it was
    passed in or created here.

    ``purge_interval``: purge completed ops from the watcher lists once about
    this many have piled up (estimated watched ops − ``num_delayed``).

    ``reaper_enabled``: start the thread ``ExpirationReaper-<name>`` that loops
    :meth:`advance_clock` (200 ms). Without it, drive the timer yourself.

    ``timer_enabled``: when False, ops are watched but never added to the timer
    (they never expire).

    Deterministic mode (used by the pipeline): a timer on a
    :class:`~tickwheel.ManualClock` with ``executor="inline"`` and
    ``reaper_enabled=False``; move the clock, then call ``advance_clock(0)``:
    expirations run in the calling thread, in order, and nothing else runs.
    """

    def __init__(
        self,
        name: str,
        timer: SystemTimer | None = None,
        purge_interval: int = 1000,
        reaper_enabled: bool = True,
        timer_enabled: bool = True,
    ) -> None:
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {name!r}")
        if type(purge_interval) is not int or purge_interval < 0:
            raise ValueError(f"purge_interval must be an int >= 0, got {purge_interval!r}")
        if timer is not None and not isinstance(timer, SystemTimer):
            raise TypeError(f"timer must be a SystemTimer or None, got {timer!r}")
        self.name = name
        self.reaper_enabled = bool(reaper_enabled)
        self._owns_timer = timer is None
        super().__init__(
            timer if timer is not None else SystemTimer(name), purge_interval, bool(timer_enabled)
        )
        self._stop = threading.Event()
        self._reaper: threading.Thread | None = None
        if self.reaper_enabled:
            self._reaper = threading.Thread(
                target=self._reap, name=f"ExpirationReaper-{name}", daemon=True
            )
            self._reaper.start()

    def _reap(self) -> None:
        """The ExpirationReaper thread: advance the clock until shutdown."""
        timer = self.timer
        stop = self._stop
        manual = is_manual(timer.clock)
        while not stop.is_set():
            try:
                fired = self.advance_clock(200)
                if not fired and manual and not stop.is_set():
                    # advance_clock never waits on a manual clock: sleep until it moves.
                    timer._wait_for_work(0.2)
            except Exception:
                if timer.closed:
                    return
                logger.exception("ExpirationReaper-%s: advance_clock failed", self.name)

    def watched_keys(self) -> list[Hashable]:
        """The keys that have a watcher list now. O(keys); for inspection."""
        return [key for shard in self._shards for key in shard.watched_keys()]

    # -- lifecycle -----------------------------------------------------------------

    def shutdown(self) -> None:
        """Stop the reaper (waking it at once) and close the timer. Idempotent.

        Pending ops never complete or expire afterwards; adding one raises RuntimeError.
        """
        if self._shutdown:
            return
        self._shutdown = True
        self._stop.set()
        reaper = self._reaper
        if reaper is not None and reaper is not threading.current_thread():
            while reaper.is_alive():
                self.timer._interrupt()
                reaper.join(0.01)
        self.timer.close()

    def __enter__(self) -> DelayedOperationPurgatory[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return (
            f"DelayedOperationPurgatory(name={self.name!r}, watched={self.watched}, "
            f"num_delayed={self.num_delayed})"
        )

# The compiled twin of the purgatory's hot halves in ``tickwheel._purgatory``:
# _DelayedOperationCore, _WatcherList and _PurgatoryCore.


# == the purgatory's hot halves =============================================================
#
# Twins of ``tickwheel._purgatory``'s ``_DelayedOperationCore``, ``_WatcherList`` and
# ``_PurgatoryCore`` (the pure module explains the algorithm and the ground rules:
# one winner, try_complete under op.lock, lock order op.lock -> shard lock -> timer
# lock, lazy removal). What a Python subclass may override (``try_complete``,
# ``on_complete``, ``on_expiration``, ``force_complete``, ``cancel``, the safe
# tries, ``run``, a timer's ``add``) is still honoured: each is called directly in
# C only while it is the base class's own.

from cpython.object cimport PyObject, PyTypeObject, Py_TYPE, PyObject_Hash
from cpython.dict cimport PyDict_Next

import _thread
from types import GenericAlias as _GenericAlias


cdef extern from "Python.h":
    # Looks a name up along the type's MRO, through CPython's method cache (borrowed).
    PyObject* _PyType_Lookup(PyTypeObject *type, PyObject *name)
    void PyObject_GC_UnTrack(void *op)

    ctypedef struct PyListObject:
        PyObject **ob_item


cdef enum:
    _SHARD_MASK = 511  # SHARDS - 1 in _purgatory: 512 shards, so hash & mask == hash % 512
    _PENDING = 0
    _COMPLETED = 1
    _CANCELLED = 2

# Makes the pending -> completed/cancelled flip atomic and guards the purgatories'
# counters (``_STATE_LOCK`` in _purgatory), taken in C.
cdef Lock _STATE_LOCK_C = Lock()
cdef object _new_rlock = _thread.RLock
cdef frozenset _LOCK_TYPES = frozenset({type(_thread.allocate_lock()), _thread.RLock})


cdef inline bint _is_base(object obj, str name, object base) noexcept:
    """True when ``type(obj)``'s ``name`` is ``base``: not overridden by a subclass."""
    return _PyType_Lookup(Py_TYPE(obj), <PyObject*>name) == <PyObject*>base


cdef inline bint _calls_base(object obj, str name, object base) noexcept:
    """True when ``obj.name()`` would call ``base``: not overridden by a subclass, and ``obj``
    has no ``__dict__`` that could hold an override (an op with ``__slots__``); otherwise
    the caller makes the Python call, as the pure twin does."""
    return Py_TYPE(obj).tp_dictoffset == 0 and _is_base(obj, name, base)


cdef int _cancel_task(TimerTask task) except -1:
    """``TimerTask.cancel`` (the same steps), callable from C; the result is not needed."""
    cdef TimerTaskList lst
    while True:
        lst = task._list
        if lst is None or lst is CANCELLED_C:
            return 0
        _lock_take(lst._fast_lock, lst._lock)
        try:
            if task._list is lst:
                lst._remove(task)
                task._list = CANCELLED_C
                return 0
        finally:
            _lock_give(lst._fast_lock, lst._lock)


cdef class _PurgatoryCore


cdef class _DelayedOperationCore(TimerTask):
    """DelayedOperation's hot half (see ``tickwheel._purgatory``): completion, safe tries, expiry."""

    cdef public object lock
    cdef public int _state
    cdef public _PurgatoryCore _purgatory

    def __init__(self, delay_ms, lock=None):
        self._delay_ms = _delay_of(delay_ms)
        self._call = None
        self.expiration_ms = -1
        if lock is None:
            lock = _new_rlock()
            # The op's own RLock refers to no object but its type, so it can never
            # be part of a cycle: the collector need not track it (CPython untracks
            # such objects itself, as tuples of atoms). A pending op is then one
            # tracked object, not two: about half the collector's work per op.
            PyObject_GC_UnTrack(<PyObject*>lock)
        elif type(lock) not in _LOCK_TYPES and not (
            hasattr(lock, "acquire") and hasattr(lock, "release")
        ):
            raise TypeError(
                f"lock must be a lock with acquire() and release() or None, got {lock!r}"
            )
        self.lock = lock
        self._state = _PENDING
        self._purgatory = None

    cdef inline int _cancel(self) except -1:
        """``self.cancel()``: in C unless a subclass overrides it."""
        if _calls_base(self, "cancel", _BASE_CANCEL):
            return _cancel_task(self)
        self.cancel()
        return 0

    def force_complete(self):
        """Complete the op if nobody has yet: cancel its timer entry and run ``on_complete()``.

        True only for the single caller that won (see ``tickwheel.DelayedOperation``).
        """
        return self._complete(False)

    cdef bint _complete(self, bint expired) except -1:
        """Flip pending -> completed (counting it, as expired too when ``expired``); then
        cancel and run ``on_complete()``. True if this call won."""
        cdef _PurgatoryCore purgatory
        _STATE_LOCK_C._take()
        if self._state != _PENDING:
            _STATE_LOCK_C._give()
            return False
        self._state = _COMPLETED
        purgatory = self._purgatory
        if purgatory is not None:
            purgatory._num_finished += 1
            if expired:
                purgatory._num_expired += 1
        _STATE_LOCK_C._give()
        self._cancel()
        self.on_complete()
        return True

    @property
    def is_completed(self):
        """True once the op has completed (by its condition or by expiring). O(1)."""
        return self._state == _COMPLETED

    cpdef object safe_try_complete(self):
        """Call ``try_complete`` with ``lock`` held; return its result."""
        lock = self.lock
        lock.acquire()
        try:
            return self.try_complete()
        finally:
            lock.release()

    def safe_try_complete_or_else(self, action):
        """Under ``lock``: try to complete; else run ``action()`` and try once more."""
        lock = self.lock
        lock.acquire()
        try:
            if self.try_complete():
                return True
            action()
            return self.try_complete()
        finally:
            lock.release()

    cdef object _try_complete_or_watch(self, _PurgatoryCore purgatory, object keys):
        """``safe_try_complete_or_else`` with the purgatory's watch as the action (no closure)."""
        lock = self.lock
        lock.acquire()
        try:
            if self.try_complete():
                return True
            purgatory._watch_c(self, keys)
            return self.try_complete()
        finally:
            lock.release()

    cpdef run(self):
        """The expiry path, run by the timer: if the op completes now, ``on_expiration()``."""
        cdef bint completed
        cdef _PurgatoryCore purgatory
        if _is_base(self, "force_complete", _BASE_FORCE_COMPLETE):
            completed = self._complete(True)
        else:
            completed = self.force_complete()
            purgatory = self._purgatory
            if completed and purgatory is not None:
                _STATE_LOCK_C._take()
                purgatory._num_expired += 1
                _STATE_LOCK_C._give()
        if completed:
            self.on_expiration()

    cdef bint _mark_cancelled_c(self) except -1:
        _STATE_LOCK_C._take()
        if self._state != _PENDING:
            _STATE_LOCK_C._give()
            return False
        self._state = _CANCELLED
        _STATE_LOCK_C._give()
        self._cancel()
        return True

    def _mark_cancelled(self):
        """Flip pending -> cancelled (no completion); True if this call did it."""
        return self._mark_cancelled_c()


cdef object _BASE_CANCEL = TimerTask.__dict__["cancel"]
cdef object _BASE_FORCE_COMPLETE = _DelayedOperationCore.__dict__["force_complete"]
cdef object _BASE_SAFE_TRY_COMPLETE_OR_ELSE = (
    _DelayedOperationCore.__dict__["safe_try_complete_or_else"]
)
cdef object _BASE_TIMER_ADD = SystemTimerCore.__dict__["add"]


@cython.final
cdef class _WatcherList:
    """One shard: the watchers of the keys hashing to it, under one lock (see ``_purgatory``)."""

    cdef readonly Lock lock
    cdef readonly dict watchers
    cdef readonly Py_ssize_t count

    def __init__(self):
        self.lock = Lock()
        self.watchers = {}
        self.count = 0

    cdef int _watch(self, object key, _DelayedOperationCore op) except -1:
        """Add ``op`` to the list of ``key``. O(1)."""
        self.lock._take()
        try:
            ops = self.watchers.get(key)
            if ops is None:
                self.watchers[key] = op
            elif type(ops) is list:
                (<list>ops).append(op)
            else:
                self.watchers[key] = [ops, op]
            self.count += 1
        finally:
            self.lock._give()
        return 0

    cdef object _ops_of(self, object key):
        """The ops of ``key``: None, the lone op itself, or a copy of the list. O(ops)."""
        self.lock._take()
        try:
            ops = self.watchers.get(key)
            if type(ops) is list:
                return (<list>ops)[:]
            return ops
        finally:
            self.lock._give()

    cdef Py_ssize_t _keep_pending(self, object ops) except -1:
        """Compact the list ``ops`` to its pending ops, in place; return how many are left.

        A lone op (not a list) counts 1 if pending, else 0. Caller holds the lock.
        """
        cdef PyObject **items
        cdef PyObject *item
        cdef Py_ssize_t i, n, kept = 0
        if type(ops) is not list:
            return 0 if (<_DelayedOperationCore>ops)._state else 1
        n = PyList_GET_SIZE(ops)
        items = (<PyListObject*>ops).ob_item
        # The pending ops move to the front, in order, by swapping pointers: no
        # reference counting, so a pending op is only read (a purge reads every
        # watched op). The ops no longer pending end at the tail, deleted at once.
        for i in range(n):
            item = items[i]
            if (<_DelayedOperationCore>item)._state == _PENDING:
                if kept != i:
                    items[i] = items[kept]
                    items[kept] = item
                kept += 1
        if kept != n:
            del (<list>ops)[kept:]
        return kept

    cdef int _store_kept(self, object key, object ops, Py_ssize_t n, Py_ssize_t kept) except -1:
        """After :meth:`_keep_pending` left ``kept`` of ``n``: drop the key, or store a lone op."""
        if kept == n:
            return 0
        self.count -= n - kept
        if kept == 0:
            del self.watchers[key]
        elif kept == 1 and type(ops) is list:
            self.watchers[key] = (<list>ops)[0]
        return 0

    cdef int _drop_done(self, object key) except -1:
        """Remove the ops of ``key`` that are no longer pending. O(ops)."""
        cdef Py_ssize_t n
        self.lock._take()
        try:
            ops = self.watchers.get(key)
            if ops is not None:
                n = PyList_GET_SIZE(ops) if type(ops) is list else 1
                self._store_kept(key, ops, n, self._keep_pending(ops))
        finally:
            self.lock._give()
        return 0

    def drop_done(self, key):
        """Remove the ops of ``key`` that are no longer pending. O(ops)."""
        self._drop_done(key)

    def watch(self, key, _DelayedOperationCore op):
        """Add ``op`` to the list of ``key``. O(1)."""
        self._watch(key, op)

    def ops_of(self, key):
        """A copy of the list of ``key`` (empty for an unknown key). O(ops)."""
        ops = self._ops_of(key)
        if ops is None:
            return ()
        return ops if type(ops) is list else (ops,)

    cdef list _cancel(self, object key):
        """Remove the list of ``key``; return its ops. O(ops)."""
        cdef list ops
        self.lock._take()
        try:
            found = self.watchers.pop(key, None)
            if found is None:
                return []
            ops = <list>found if type(found) is list else [found]
            self.count -= PyList_GET_SIZE(ops)
            return ops
        finally:
            self.lock._give()

    def cancel(self, key):
        """Remove the list of ``key``; return its ops. O(ops)."""
        return self._cancel(key)

    cdef Py_ssize_t _purge(self) except -1:
        """Remove the ops no longer pending from every list; return how many. O(entries)."""
        cdef Py_ssize_t pos = 0, before, n, kept
        cdef PyObject *k
        cdef PyObject *v
        cdef list changed = None
        self.lock._take()
        try:
            before = self.count
            # Compact each list in place (the dict does not change); keys left with
            # one op or none are changed after the walk.
            while PyDict_Next(self.watchers, &pos, &k, &v):
                ops = <object>v
                n = PyList_GET_SIZE(ops) if type(ops) is list else 1
                kept = self._keep_pending(ops)
                if kept == n:
                    continue
                if kept > 1:
                    self.count -= n - kept
                    continue
                if changed is None:
                    changed = []
                changed.append((<object>k, ops, n, kept))
            if changed is not None:
                for key, ops, n, kept in changed:
                    self._store_kept(key, ops, n, kept)
            return before - self.count
        finally:
            self.lock._give()

    def purge(self):
        """Remove the ops no longer pending from every list; return how many. O(entries)."""
        return self._purge()

    def watched_keys(self):
        """The keys with a list. O(keys)."""
        self.lock._take()
        try:
            return list(self.watchers)
        finally:
            self.lock._give()


cdef int _check_keys(object keys) except -1:
    """TypeError for a str or bytes (a key, not keys); ValueError for no keys."""
    if (type(keys) is tuple or type(keys) is list) and len(keys):
        return 0
    if isinstance(keys, (str, bytes)):
        raise TypeError(
            f"keys must be a sequence of keys, not {type(keys).__name__} {keys!r}; "
            "wrap a single key in a list"
        )
    if not keys:
        raise ValueError("keys must not be empty: an op needs at least one watch key")
    return 0


cdef class _PurgatoryCore:
    """DelayedOperationPurgatory's hot half (see ``tickwheel._purgatory``)."""

    cdef readonly object timer
    cdef SystemTimerCore _fast_timer  # the timer while its add is SystemTimerCore's, else None
    cdef object _timer_add
    cdef object _timer_advance
    cdef public long long purge_interval
    cdef public bint timer_enabled
    cdef readonly list _shards
    cdef public long long _estimated_total
    cdef public long long _num_finished
    cdef public long long _num_expired
    cdef public long long _num_cancelled
    cdef public long long _num_purged
    cdef public bint _shutdown

    def __init__(self, timer, long long purge_interval, bint timer_enabled):
        self.timer = timer
        # The add and the advance are bound once, as in the pure twin; the add is
        # made in C while it is SystemTimerCore's own (not one a subclass or the
        # instance overrides).
        self._fast_timer = (
            timer
            if isinstance(timer, SystemTimerCore)
            and _is_base(timer, "add", _BASE_TIMER_ADD)
            and "add" not in getattr(timer, "__dict__", ())
            else None
        )
        self._timer_add = timer.add
        self._timer_advance = timer.advance_clock
        self.purge_interval = purge_interval
        self.timer_enabled = timer_enabled
        self._shards = [_WatcherList() for _ in range(_SHARD_MASK + 1)]
        self._estimated_total = 0
        self._num_finished = 0
        self._num_expired = 0
        self._num_cancelled = 0
        self._num_purged = 0
        self._shutdown = False

    def __class_getitem__(cls, item):
        """``_PurgatoryCore[T]``, as for the pure twin (a Generic)."""
        return _GenericAlias(cls, item)

    # -- watching and completing ---------------------------------------------------

    def try_complete_else_watch(self, _DelayedOperationCore op, keys):
        """Complete ``op`` now if it can; else watch it on every key and add it to the timer.

        See ``tickwheel.DelayedOperationPurgatory.try_complete_else_watch``.
        """
        _check_keys(keys)
        if self._shutdown:
            raise RuntimeError(f"purgatory {self.name!r} is shut down")
        if op._state:
            return False
        op._purgatory = self
        if _calls_base(op, "safe_try_complete_or_else", _BASE_SAFE_TRY_COMPLETE_OR_ELSE):
            if op._try_complete_or_watch(self, keys):
                return True
        elif op.safe_try_complete_or_else(lambda: self._watch_c(op, keys)):
            return True
        if not op._state:
            if self.timer_enabled:
                if self._fast_timer is not None:
                    self._fast_timer._add_c(op)
                else:
                    self._timer_add(op)
            if op._state:
                op._cancel()
        return False

    cdef int _watch_c(self, _DelayedOperationCore op, object keys) except -1:
        """Add ``op`` to the watcher list of each key, stopping once it has completed."""
        cdef bint watched = False
        for key in keys:
            if op._state:
                break
            self._shard(key)._watch(key, op)
            watched = True
        if watched:
            self._estimated_total += 1
        return 0

    def _watch(self, _DelayedOperationCore op, keys):
        """Add ``op`` to the watcher list of each key, stopping once it has completed."""
        self._watch_c(op, keys)

    cdef _WatcherList _shard(self, object key):
        """The shard of ``key``. TypeError if the key is not hashable."""
        cdef Py_hash_t h
        try:
            h = PyObject_Hash(key)
        except TypeError:
            raise TypeError(f"watch key {key!r} is not hashable") from None
        return <_WatcherList>self._shards[h & _SHARD_MASK]

    def check_and_complete(self, key):
        """Try to complete every op watched on ``key``; return how many this call completed.

        See ``tickwheel.DelayedOperationPurgatory.check_and_complete``.
        """
        cdef _WatcherList shard = self._shard(key)
        cdef Py_ssize_t completed = 0, i, n
        cdef bint dirty = False
        cdef list snapshot
        cdef _DelayedOperationCore op
        ops = shard._ops_of(key)
        if ops is None:
            return 0
        if type(ops) is list:
            snapshot = <list>ops
            n = PyList_GET_SIZE(snapshot)
            for i in range(n):
                op = <_DelayedOperationCore>snapshot[i]
                if op._state:
                    dirty = True
                elif op.safe_try_complete():
                    completed += 1
        else:
            op = <_DelayedOperationCore>ops
            if op._state:
                dirty = True
            elif op.safe_try_complete():
                completed += 1
        if dirty or completed:
            shard._drop_done(key)
        return completed

    def cancel_for_key(self, key):
        """Stop watching ``key``: cancel its pending ops (not completed) and return them.

        See ``tickwheel.DelayedOperationPurgatory.cancel_for_key``.
        """
        cdef list cancelled = [
            op
            for op in self._shard(key)._cancel(key)
            if (<_DelayedOperationCore>op)._mark_cancelled_c()
        ]
        if cancelled:
            _STATE_LOCK_C._take()
            self._num_cancelled += PyList_GET_SIZE(cancelled)
            _STATE_LOCK_C._give()
        return cancelled

    # -- expiry and purging ----------------------------------------------------------

    def advance_clock(self, timeout_ms=0):
        """One reaper step: ``timer.advance_clock(timeout_ms)``, then purge if due."""
        fired = self._timer_advance(timeout_ms)
        if self._estimated_total - self.timer.size > self.purge_interval:
            self.purge_completed()
        return fired

    def purge_completed(self):
        """Remove every op that is no longer pending from all watcher lists; return how many."""
        cdef Py_ssize_t purged = 0
        cdef _WatcherList shard
        self._estimated_total = self.timer.size
        for shard in self._shards:
            if shard.count:
                purged += shard._purge()
        if purged:
            _STATE_LOCK_C._take()
            self._num_purged += purged
            _STATE_LOCK_C._give()
        return purged

    # -- metrics ----------------------------------------------------------------

    @property
    def watched(self):
        """Entries across all watcher lists, completed ones included until removed. O(shards)."""
        cdef Py_ssize_t total = 0
        cdef _WatcherList shard
        for shard in self._shards:
            total += shard.count
        return total

    @property
    def num_delayed(self):
        """Ops pending in the timer (the timer's size). O(1)."""
        return self.timer.size

    @property
    def num_completed(self):
        """Ops of this purgatory completed by their condition (not expired). O(1)."""
        return self._num_finished - self._num_expired

    @property
    def num_expired(self):
        """Ops of this purgatory that timed out. O(1)."""
        return self._num_expired

    @property
    def num_cancelled(self):
        """Ops cancelled by :meth:`cancel_for_key`. O(1)."""
        return self._num_cancelled

    @property
    def num_purged(self):
        """Watcher entries removed by purges so far. O(1)."""
        return self._num_purged

# The compiled twin of ``tickwheel._delay_queue``: BucketDelayQueue. The C fields are
# declared in _delay_queue.pxd.


# -- the delay queue ---------------------------------------------------------------


@cython.final
cdef inline bint _item_before(tuple a, tuple b) except -1:
    """``a < b`` for two ``(expiration_ms, seq, bucket)`` items: their keys compared in C."""
    cdef long long ea = a[0]
    cdef long long eb = b[0]
    if ea != eb:
        return ea < eb
    return <long long>a[1] < <long long>b[1]


cdef class BucketDelayQueue:
    """A min-heap of buckets keyed by ``(expiration_ms, insertion order)``.

    The heap is ``heapq``'s (the same list of tuples, the same sift steps), its
    keys compared as C integers instead of through tuple and int comparison.
    """


    def __init__(self):
        self._heap = []
        self._seq = 0

    cdef bint _offer(self, TimerTaskList bucket) except -1:
        cdef list heap = self._heap
        cdef tuple item = (bucket._expiration_ms, self._seq, bucket)
        cdef Py_ssize_t pos = PyList_GET_SIZE(heap)
        cdef Py_ssize_t parent
        self._seq += 1
        heap.append(item)
        # heapq's _siftdown(heap, 0, pos).
        while pos > 0:
            parent = (pos - 1) >> 1
            if not _item_before(item, <tuple>heap[parent]):
                break
            heap[pos] = heap[parent]
            pos = parent
        heap[pos] = item
        return pos == 0

    cdef tuple _pop(self):
        """heapq.heappop: the smallest item, the heap re-ordered."""
        cdef list heap = self._heap
        cdef tuple last = heap.pop()
        cdef tuple top
        cdef Py_ssize_t n = PyList_GET_SIZE(heap)
        cdef Py_ssize_t pos = 0
        cdef Py_ssize_t child
        if n == 0:
            return last
        top = heap[0]
        # heapq's _siftup(heap, 0): the hole goes down to a leaf, then last sifts up.
        child = 1
        while child < n:
            if child + 1 < n and not _item_before(<tuple>heap[child], <tuple>heap[child + 1]):
                child += 1
            heap[pos] = heap[child]
            pos = child
            child = 2 * pos + 1
        while pos > 0:
            child = (pos - 1) >> 1
            if not _item_before(last, <tuple>heap[child]):
                break
            heap[pos] = heap[child]
            pos = child
        heap[pos] = last
        return top

    cdef long long _head(self) noexcept:
        """The first bucket's expiration, or NEVER."""
        if PyList_GET_SIZE(self._heap) == 0:
            return NEVER_C
        return (<tuple>self._heap[0])[0]

    cdef TimerTaskList _poll(self, long long now_ms):
        if PyList_GET_SIZE(self._heap) and self._head() <= now_ms:
            return self._pop()[2]
        return None

    def offer(self, TimerTaskList bucket):
        """Queue ``bucket`` under its current expiration; True if it is the new head. O(log b)."""
        return self._offer(bucket)

    def head_expiration_ms(self):
        """The expiration of the first bucket, or None when empty. O(1)."""
        return self._heap[0][0] if self._heap else None

    def poll(self, long long now_ms):
        """Remove and return the first bucket if it is due at ``now_ms``; else None. O(log b)."""
        return self._poll(now_ms)

    def __len__(self):
        """Number of queued buckets. O(1)."""
        return len(self._heap)

    def entries(self):
        """``(expiration_ms, bucket)`` for every queued bucket, in due order. O(b log b)."""
        return [(exp, bucket) for exp, _, bucket in sorted(self._heap, key=lambda e: e[:2])]

    def _check(self):
        """Assert the heap property and that every entry matches its bucket's expiration."""
        from tickwheel._delay_queue import check_queue

        check_queue(self)

# The compiled core's C declarations, one file per twin (as uvloop's loop.pxd includes
# handles/*.pxd): the C fields and methods of the classes that other compiled modules
# use (``from tickwheel._speedups cimport TimerCore``: tickwheel.pipeline._loop, the
# benchmarks' floors), and that the twins call on one another. The classes and functions
# no other module needs are declared where they are defined, in _twins/*.pxi.

# Every class first, so that a declaration may name one declared in a later file.
cdef class Lock
cdef class TaskCounter
cdef class TimerTaskEntry
cdef class TimerTaskList
cdef class BucketDelayQueue
cdef class TimingWheel
cdef class TimerCore

include "_twins/_task_list.pxd"
include "_twins/_delay_queue.pxd"
include "_twins/_wheel.pxd"
include "_twins/_timer_core.pxd"
include "_twins/aio/_handle.pxd"

"""tickwheel.aio: the hierarchical timing wheel as an asyncio timer service.

One line puts every asyncio timer of a program on the wheel: run it on
:class:`EventLoop` (``loop_factory=tickwheel.aio.new_event_loop``, or
:func:`install`), asyncio's own loop whose ``call_later`` and ``call_at`` go
to one :class:`AsyncTimer` (``new_uvloop_event_loop`` does the same on
uvloop). Or use an :class:`AsyncTimer` directly, on any loop.

An :class:`AsyncTimer` keeps its timers in a Kafka timing wheel and holds
exactly one timer of the event loop. Every operation exists as a method of
:class:`AsyncTimer` and as a module function (:func:`sleep`, :func:`timeout`,
:func:`timeout_at`, :func:`wait_for`, :func:`call_later`, :func:`call_at`) that
uses the running loop's default timer, :func:`get_timer`. An ``AsyncTimer``
belongs to one loop and must only be used from that loop's thread (it takes
no lock).

The modules, each importing only those above it:

* ``_handle``: :class:`TimerHandle` and the arithmetic of a deadline;
* ``_debug``: asyncio's debug mode for the callbacks a wheel runs;
* ``_timeouts``: :class:`Timeout`, ``asyncio.timeout`` on the wheel;
* ``_timer``: :class:`AsyncTimer` (its hot half has a compiled twin);
* ``_default``: :func:`get_timer` and the module functions;
* ``_loop``: :class:`EventLoop`, its policy and the uvloop variant;
* ``_virtual``: :class:`VirtualClockEventLoop`, a loop whose clock jumps.

See ``docs/aio.md`` for the semantics in full.
"""

from ._default import call_at, call_later, get_timer, sleep, timeout, timeout_at, wait_for
from ._handle import TimerHandle
from ._loop import EventLoop, EventLoopPolicy, install, new_event_loop, new_uvloop_event_loop
from ._timeouts import Timeout
from ._timer import AsyncTimer
from ._virtual import VirtualClockEventLoop

__all__ = [
    "AsyncTimer",
    "EventLoop",
    "EventLoopPolicy",
    "Timeout",
    "TimerHandle",
    "VirtualClockEventLoop",
    "call_at",
    "call_later",
    "get_timer",
    "install",
    "new_event_loop",
    "new_uvloop_event_loop",
    "sleep",
    "timeout",
    "timeout_at",
    "wait_for",
]

# What the compiled timer needs of ``tickwheel.aio._debug``: whether the loop is in debug
# mode (read without a Python call), and debug mode's runner of a batch (Python, cold).

cdef inline bint _in_debug_mode(object loop) except -1:
    """``loop.get_debug()``: asyncio's loops (and tickwheel's) read without a Python call."""
    debug = getattr(loop, "_debug", None)
    if debug is None:
        debug = loop.get_debug()
    return bool(debug)


cdef object _debug_run_class = None


cdef object _debug_run(object loop, object report):
    """``aio._debug.DebugRun(loop, report)``: debug mode's runner of a batch (cold, Python)."""
    global _debug_run_class
    if _debug_run_class is None:
        from tickwheel.aio._debug import DebugRun

        _debug_run_class = DebugRun
    return _debug_run_class(loop, report)


import time as _time_module

cdef object _time_monotonic = _time_module.monotonic

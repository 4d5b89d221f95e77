# C declarations from the twin of tickwheel.aio._handle; included by _speedups.pxd.

# A deadline in seconds rounded up to the millisecond, as the wheel files it (the
# benchmarks' floors cimport it).
cdef long long _ceil_ms(double when) noexcept

"""Test support code shared by the test suite and the benchmarks (never shipped).

* :mod:`support.reference`: the plain-Python reference of the pipeline's semantics;
* :mod:`support.pgserver`: a throw-away PostgreSQL server for the sink tests.

pytest puts ``tests/`` on ``sys.path`` (``pythonpath`` in ``pyproject.toml``);
the benchmarks add it themselves.
"""

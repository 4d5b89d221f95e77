"""Test support code shared by the test suite and the benchmarks (never shipped).

* :mod:`support.reference`: the plain-Python reference of the pipeline's semantics;
* :mod:`support.pgserver`: a throw-away PostgreSQL server for the sink tests;
* :mod:`support.paths`: ``load_pure``, the pure path beside the compiled one;
* :mod:`support.kafka_like`: a Kafka-like streaming source for the stream's tests.

pytest puts ``tests/`` on ``sys.path`` (``pythonpath`` in ``pyproject.toml``);
the benchmarks add it themselves.
"""

"""Sinks of your own for ``start_stream``: functions ``fn(tables, batch_id)``, Spark's way.

``start_stream(records, rules, checkpoint=CK, sink=fn)`` calls ``fn`` with each
micro-batch's ``outcomes``, ``unmatched``, ``rejected`` and ``late``
DataFrames and its batch id, as Spark's ``foreachBatch`` calls a function.
After a crash Spark replays the batch id, and ``fn`` gets the same rows
again: what it writes must be idempotent by batch id, or its consumers must
drop what they saw twice. One example of each:

* :func:`replace_batch_partition`: a table partitioned by ``batch_id``, whose
  partition of the batch is replaced on a replay (what Delta's ``replaceWhere``
  or its ``txnAppId``/``txnVersion`` options do for a Delta table);
* :func:`append_to_topic`: each outcome appended to a Kafka topic through a
  producer (``kafka-python``'s ``KafkaProducer``, say), keyed by the
  operation, with the batch id in the record: a replay appends the batch
  again, and the consumer keeps the first copy of each (batch id, rule, key,
  operation id).

``tests/pipeline/test_sink_functions.py`` runs both, killed between the
function's writes and the checkpoint's commit.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol

from pyspark.sql import DataFrame
from pyspark.sql import functions as F


def replace_batch_partition(root: str) -> Any:
    """A sink writing each table to ``root/<table>/batch_id=N/``, replaced on a replay."""

    def sink(tables: Mapping[str, DataFrame], batch_id: int) -> None:
        for name, frame in tables.items():
            (
                frame.withColumn("batch_id", F.lit(batch_id).cast("long"))
                .write.mode("overwrite")
                .option("partitionOverwriteMode", "dynamic")  # only this batch's partition
                .partitionBy("batch_id")
                .parquet(f"{root}/{name}")
            )

    return sink


class Producer(Protocol):
    """What :func:`append_to_topic` needs of a Kafka producer (``kafka-python``'s API)."""

    def send(self, topic: str, value: bytes, key: bytes) -> Any: ...

    def flush(self) -> None: ...


def append_to_topic(producer: Producer, topic: str) -> Any:
    """A sink sending each final outcome to ``topic``; duplicates on a replay are the
    consumer's to drop, by (batch_id, rule, key, op_id)."""

    def sink(tables: Mapping[str, DataFrame], batch_id: int) -> None:
        for row in tables["outcomes"].toLocalIterator():
            record = {**row.asDict(), "batch_id": batch_id}
            key = f"{row['rule']}/{row['key']}/{row['op_id']}".encode()
            producer.send(topic, value=json.dumps(record).encode(), key=key)
        producer.flush()

    return sink


def first_copies(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The consumer's side of :func:`append_to_topic`: each outcome once, in order."""
    seen: set[tuple[Any, ...]] = set()
    kept = []
    for record in records:
        identity = (record["batch_id"], record["rule"], record["key"], record["op_id"])
        if identity not in seen:
            seen.add(identity)
            kept.append(record)
    return kept

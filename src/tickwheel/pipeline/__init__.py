"""tickwheel.pipeline: event-time delayed operations over keyed event streams, on Spark.

* :mod:`.rules`: the rules TOML file;
* :mod:`.core`: :class:`PartitionProcessor`, one partition's purgatory on an
  event-time clock (pure Python);
* :mod:`.reference`: a plain-Python reference of the semantics;
* :mod:`.events` and :mod:`.spark_job`: the Spark job (needs the ``spark`` extra);
* :mod:`.generate` and :mod:`.report`: demo data and reports.

Importing this package does not import pyspark.
"""

from .core import Event, OutcomeRow, PartitionProcessor, StateRow, UnmatchedRow
from .rules import InputConfig, Rule, Rules, RulesError, load_rules, parse_duration, parse_rules

__all__ = [
    "Event",
    "InputConfig",
    "OutcomeRow",
    "PartitionProcessor",
    "Rule",
    "Rules",
    "RulesError",
    "StateRow",
    "UnmatchedRow",
    "load_rules",
    "parse_duration",
    "parse_rules",
]

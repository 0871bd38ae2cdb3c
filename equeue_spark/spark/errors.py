"""The connector's own exceptions, extending the client's tree (client/errors.py)::

    EqueueError
    ├── InvalidOption        an unknown option, or an option with a bad value
    │                        (the message names both); raised when the query starts
    │   └── NoOffsetForTimestamp  startingOffsetsByTimestampStrategy=error and
    │                             a queue has no record at or after its time
    ├── OffsetsLostError     records the query still had to read were removed
    │                        (retention, or a topic recreated) and
    │                        failOnDataLoss is true
    ├── CorruptRecordError   mode=FAILFAST: a record does not decode with its
    │                        schema (names topic, queue, offset, version)
    ├── SchemaChanged        schemaEvolutionMode=restart: a record of a newer
    │                        schema version arrived
    └── BrokerUnavailable (the client's)
        └── BrokerUnreachable  no answer within timeoutMs (a dead or wrong
                               address): names the address and timeoutMs

Spark wraps them in its own exceptions; the message text survives, so a user
sees the option or the offsets named in the query's failure. The data
source's entry points (source.py) raise them without the call chain below
(``from None``), so Spark's rendering of the Python traceback is a few lines
ending in the one that matters.
"""

from __future__ import annotations

from equeue_spark.client.errors import BrokerUnavailable, EqueueError


class InvalidOption(EqueueError, ValueError):
    """An option is unknown, missing, or has a value it cannot take."""


class OffsetsLostError(EqueueError):
    """Records between the query's position and the queue's earliest offset are gone."""


class BrokerUnreachable(BrokerUnavailable):
    """The broker (or a cluster's name servers) did not answer within ``timeoutMs``."""


class NoOffsetForTimestamp(InvalidOption):
    """``startingOffsetsByTimestampStrategy=error`` and a queue has no record
    stored at or after its starting time (the message names the queue)."""


class CorruptRecordError(EqueueError):
    """With ``mode=FAILFAST``: a record's value (or key) does not decode with
    its schema; the message names topic, queue, offset and schema version."""


class SchemaChanged(EqueueError):
    """With ``schemaEvolutionMode=restart``: a record was written with a newer
    schema version than the query reads with; restart the query to read with it."""

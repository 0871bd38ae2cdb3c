"""The connector's own exceptions, extending the client's tree (client/errors.py)::

    EqueueError
    ├── InvalidOption        an unknown option, or an option with a bad value
    │                        (the message names both); raised when the query starts
    └── OffsetsLostError     records the query still had to read were removed
                             (retention, or a topic recreated) and
                             failOnDataLoss is true

Spark wraps them in its own exceptions; the message text survives, so a user
sees the option or the offsets named in the query's failure.
"""

from __future__ import annotations

from equeue_spark.client.errors import EqueueError


class InvalidOption(EqueueError, ValueError):
    """An option is unknown, missing, or has a value it cannot take."""


class OffsetsLostError(EqueueError):
    """Records between the query's position and the queue's earliest offset are gone."""

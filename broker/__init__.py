"""equeue: a persistent message queue broker following the EQueue/RocketMQ design."""

__version__ = "0.1.0"

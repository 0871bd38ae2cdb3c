"""The ``equeue`` commands, one module per command group: each function takes
the parsed arguments and an ``Output``, talks to the broker through the client,
and prints (the parsers in ``equeue_spark.cli.parsers`` name them as handlers)."""

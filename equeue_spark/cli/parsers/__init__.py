"""The ``equeue`` argument parsers, one module per command group; each adds its
commands to a ``Commands`` level and names their handlers in
``equeue_spark.cli.commands``. ``equeue_spark.cli.parser`` puts them together."""

"""``equeue``: the command-line tool for an equeue broker.

::

    equeue [--broker HOST:PORT] [--timeout-s S] [--retries N] [--json]
           [--token-file PATH] [--tls] [--tls-ca PATH] [--tls-cert PATH --tls-key PATH]
           COMMAND ...

    topics   create | list | describe | delete | add-queue | set-visibility | delete-queue
    produce  TOPIC            lines of stdin (or --file) as messages
    consume  TOPIC            print messages (--group, --from, --max, --timeout, --tags)
    groups   list | describe | reset | delete
    message  get ID           one message, by id or by --topic/--queue/--offset
    stats                     broker-wide statistics

The common options are accepted before the command or after it. ``--broker``
defaults to ``$EQUEUE_BROKER``, else 127.0.0.1:5000. Output is aligned tables
for people, or with ``--json`` one JSON document (JSON lines for ``consume``)
whose field names are the ``.proto``'s. Broker errors print ``equeue: <message>``
on stderr and exit 1; usage errors exit 2.

Only the standard library and the equeue client: importing this package never
imports pyspark. Its modules:

* ``app``: ``main``, arguments to exit code;
* ``parser``: ``build_parser``, from the per-group modules of ``parsers``;
* ``arguments``: value types, the common options, ``Commands`` (subcommand levels);
* ``commands``: what each command does, one module per command group;
* ``formatting``: tables, pairs and JSON output (``Output``);
* ``common``: defaults, the CLI's errors, the client configuration from the options.

This package exports ``main`` (the ``equeue`` console script) and, for callers
of the former single module, ``build_parser`` and ``format_table``.
"""

from equeue_spark.cli.app import main
from equeue_spark.cli.formatting import format_table
from equeue_spark.cli.parser import build_parser

__all__ = ["build_parser", "format_table", "main"]

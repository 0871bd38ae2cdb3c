"""The ``equeue`` argument parser: the top-level options, then each command
group's parser module in the order ``equeue --help`` lists them."""

from __future__ import annotations

import argparse

from equeue_spark import __version__
from equeue_spark.cli.arguments import Commands, add_common
from equeue_spark.cli.common import PROG
from equeue_spark.cli.parsers.admin import add_message, add_stats
from equeue_spark.cli.parsers.cluster import add_cluster
from equeue_spark.cli.parsers.dlq import add_dlq
from equeue_spark.cli.parsers.groups import add_groups
from equeue_spark.cli.parsers.messaging import add_consume, add_produce
from equeue_spark.cli.parsers.schemas import add_schemas
from equeue_spark.cli.parsers.topics import add_topics
from equeue_spark.cli.parsers.transactions import add_transactions


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Administer an equeue broker, and produce and consume messages.",
        epilog="Run 'equeue COMMAND --help' for a command's options.",
        allow_abbrev=False,
    )
    parser.add_argument("-V", "--version", action="version", version=f"%(prog)s {__version__}")
    add_common(parser, top=True)
    common = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    add_common(common, top=False)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    commands = Commands(subparsers, common)
    add_topics(commands)
    add_schemas(commands)
    add_produce(commands)
    add_consume(commands)
    add_groups(commands)
    add_dlq(commands)
    add_transactions(commands)
    add_message(commands)
    add_stats(commands)
    add_cluster(commands)
    return parser

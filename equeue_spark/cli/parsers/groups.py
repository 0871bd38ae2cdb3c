"""Arguments of ``equeue groups``: list, describe, reset and delete."""

from __future__ import annotations

import argparse

from equeue_spark.cli.arguments import Commands, non_negative_int, queue_offset
from equeue_spark.cli.commands.groups import (
    cmd_groups_delete,
    cmd_groups_describe,
    cmd_groups_list,
    cmd_groups_reset,
)


def add_groups(commands: Commands) -> None:
    groups = commands.group("groups", "list, describe, reset and delete consumer groups")
    groups.command("list", "list consumer groups with their lag", cmd_groups_list)
    describe_help = "show a group's offsets, lag and consumers"
    p = groups.command("describe", describe_help, cmd_groups_describe)
    p.add_argument("group", metavar="G")
    reset_help = "move a group's committed offsets on a topic"
    p = groups.command("reset", reset_help, cmd_groups_reset)
    p.add_argument("group", metavar="G")
    p.add_argument("--topic", required=True, metavar="T")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--to-earliest", action="store_true", help="earliest retained offsets")
    where.add_argument("--to-latest", action="store_true", help="end of every queue")
    where.add_argument(
        "--to-timestamp",
        type=non_negative_int,
        metavar="MS",
        help="first message stored at or after this time (ms since the epoch)",
    )
    where.add_argument(
        "--to-offset",
        type=queue_offset,
        nargs="+",
        action="extend",
        metavar="QUEUE=OFFSET",
        help="explicit next offsets (queues not given are unchanged)",
    )
    p.add_argument(
        "--on-broker", metavar="NAME", help="with --namesrv and --to-offset: the queues' broker"
    )
    _add_force(p, "reset")
    p = groups.command("delete", "forget a group's committed offsets", cmd_groups_delete)
    p.add_argument("group", metavar="G")
    _add_force(p, "delete")


def _add_force(parser: argparse.ArgumentParser, action: str) -> None:
    parser.add_argument(
        "--force",
        action="store_true",
        help=f"{action} even if the group has live members (they may commit over it)",
    )

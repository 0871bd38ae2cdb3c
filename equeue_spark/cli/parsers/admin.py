"""Arguments of ``equeue message get|cancel`` and ``equeue stats``."""

from __future__ import annotations

from equeue_spark.cli.arguments import Commands, non_negative_int
from equeue_spark.cli.commands.admin import cmd_message_cancel, cmd_message_get, cmd_stats


def add_message(commands: Commands) -> None:
    message = commands.group("message", "fetch one message, or cancel a delayed one")
    get_help = "fetch a message by id or by queue address"
    p = message.command("get", get_help, cmd_message_get)
    p.add_argument("id", nargs="?", metavar="ID", help="message id, as printed by produce")
    p.add_argument("--topic", metavar="T")
    p.add_argument("--queue", type=non_negative_int, metavar="Q")
    p.add_argument("--offset", type=non_negative_int, metavar="O")
    p.add_argument("--raw", action="store_true", help="write only the value's bytes")
    cancel_help = "cancel a delayed message still pending (it is never delivered)"
    p = message.command("cancel", cancel_help, cmd_message_cancel)
    p.add_argument("id", metavar="ID", help="message id, as printed by produce --delay")


def add_stats(commands: Commands) -> None:
    commands.command("stats", "broker-wide statistics", cmd_stats)

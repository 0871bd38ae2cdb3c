"""Arguments of ``equeue dlq``: list, resend and purge a group's dead letters."""

from __future__ import annotations

from equeue_spark.cli.arguments import Commands, positive_int
from equeue_spark.cli.commands.dlq import cmd_dlq_list, cmd_dlq_purge, cmd_dlq_resend

DLQ_HELP = "list, resend and purge a consumer group's dead letters"


def add_dlq(commands: Commands) -> None:
    dlq = commands.group("dlq", DLQ_HELP)
    p = dlq.command("list", "print a group's dead letters with where they came from", cmd_dlq_list)
    p.add_argument("group", metavar="GROUP")
    p.add_argument(
        "--max", type=positive_int, default=1000, metavar="N", help="at most N (default 1000)"
    )
    resend_help = "append dead letters back to the topic and queue they came from, once each"
    p = dlq.command("resend", resend_help, cmd_dlq_resend)
    p.add_argument("group", metavar="GROUP")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--ids", metavar="ID,...", help="these dead letters (ids as listed)")
    which.add_argument("--all", action="store_true", help="every one not resent yet")
    purge_help = "delete a group's dead-letter topic and everything in it"
    p = dlq.command("purge", purge_help, cmd_dlq_purge)
    p.add_argument("group", metavar="GROUP")

"""Arguments of ``equeue transactions``: list and abort."""

from __future__ import annotations

from equeue_spark.cli.arguments import Commands
from equeue_spark.cli.commands.transactions import cmd_transactions_abort, cmd_transactions_list


def add_transactions(commands: Commands) -> None:
    help_ = "list and abort open (staged, uncommitted) transactions"
    transactions = commands.group("transactions", help_)
    list_help = (
        "open transactions (id, producer group, age, checks so far, next check, messages, "
        "bytes, queues, state) and every sink's last committed batch"
    )
    p = transactions.command("list", list_help, cmd_transactions_list)
    p.add_argument("--prefix", metavar="P", help="only transactions whose id starts with P")
    p = transactions.command("abort", "discard open transactions", cmd_transactions_abort)
    p.add_argument("ids", nargs="*", metavar="ID", help="transaction ids")
    p.add_argument("--prefix", metavar="P", help="also every transaction whose id starts with P")

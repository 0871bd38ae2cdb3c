"""Arguments of ``equeue cluster``: list and routes."""

from __future__ import annotations

from equeue_spark.cli.arguments import Commands
from equeue_spark.cli.commands.cluster import cmd_cluster_list, cmd_cluster_routes

LIST_DESCRIPTION = (
    "The live brokers the name servers know (--namesrv): name, cluster, role (master,\n"
    "replica; a master that routes do not use, e.g. one with an older epoch, shows\n"
    "'master (not routed)'), epoch, address, topics and when the name server last\n"
    "heard from each."
)
ROUTES_DESCRIPTION = (
    "A topic's route: its queues as the ordered (broker, queue id) list producers\n"
    "route keys over, with each broker group's master (address, epoch) and replicas\n"
    "and each queue's permissions."
)


def add_cluster(commands: Commands) -> None:
    cluster = commands.group("cluster", "show a cluster's brokers and topic routes (--namesrv)")
    p = cluster.command("list", "list the live brokers", cmd_cluster_list, LIST_DESCRIPTION)
    p.add_argument("--cluster", metavar="NAME", default="", help="only this cluster's brokers")
    p = cluster.command("routes", "show a topic's route", cmd_cluster_routes, ROUTES_DESCRIPTION)
    p.add_argument("topic", metavar="TOPIC")

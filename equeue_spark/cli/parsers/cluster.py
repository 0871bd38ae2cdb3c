"""Arguments of ``equeue cluster``: list, routes and promote."""

from __future__ import annotations

from equeue_spark.cli.arguments import Commands
from equeue_spark.cli.commands.cluster import cmd_cluster_list, cmd_cluster_routes
from equeue_spark.cli.commands.promote import cmd_cluster_promote

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

PROMOTE_DESCRIPTION = (
    "Make the most advanced in-sync replica of GROUP (a broker name) its master, for\n"
    "groups run without ZooKeeper: in sync by the master's account when it answers,\n"
    "else the reachable replica with the greatest log end (said). The new epoch is\n"
    "one above every epoch seen; every other reachable member, an old master\n"
    "included, then follows the new master (an old master truncates what it never\n"
    "replicated). Members: --brokers, or the group's brokers the name servers know\n"
    "plus the replicas its master reports."
)


def add_cluster(commands: Commands) -> None:
    cluster = commands.group("cluster", "show a cluster's brokers and topic routes (--namesrv)")
    p = cluster.command("list", "list the live brokers", cmd_cluster_list, LIST_DESCRIPTION)
    p.add_argument("--cluster", metavar="NAME", default="", help="only this cluster's brokers")
    p = cluster.command("routes", "show a topic's route", cmd_cluster_routes, ROUTES_DESCRIPTION)
    p.add_argument("topic", metavar="TOPIC")
    p = cluster.command(
        "promote", "promote a group's replica (manual failover)", cmd_cluster_promote,
        PROMOTE_DESCRIPTION,
    )  # fmt: skip
    p.add_argument("group", metavar="GROUP", help="the group: its broker name")
    p.add_argument(
        "--brokers", metavar="HOST:PORT[,HOST:PORT...]", help="the group's members (or --namesrv)"
    )

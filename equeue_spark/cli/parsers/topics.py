"""Arguments of ``equeue topics``: create, list, describe, delete, add-queue,
set-visibility and delete-queue."""

from __future__ import annotations

from equeue_spark.cli.arguments import Commands, non_negative_int, on_off, positive_int
from equeue_spark.cli.commands.topics import (
    cmd_topics_add_queue,
    cmd_topics_create,
    cmd_topics_delete,
    cmd_topics_delete_queue,
    cmd_topics_describe,
    cmd_topics_list,
    cmd_topics_set_visibility,
)

DESCRIBE_DESCRIPTION = (
    "The topic's creation time, queue count and incarnation (a new id each time the\n"
    "name is created again). Per queue: id, earliest and end offsets, lowest committed\n"
    "offset of any group, backlog, and whether producers and consumers see it."
)


def add_topics(commands: Commands) -> None:
    topics = commands.group("topics", "create, list, describe and delete topics and their queues")
    p = topics.command("create", "create a topic", cmd_topics_create)
    p.add_argument("name", metavar="NAME")
    queues_help = "number of queues (default: the broker's default)"
    p.add_argument("--queues", type=positive_int, default=0, metavar="N", help=queues_help)
    brokers_help = "with --namesrv: the brokers to create N queues on each (default: all live)"
    p.add_argument("--brokers", metavar="NAME[,NAME...]", help=brokers_help)
    topics.command("list", "list topics", cmd_topics_list)
    describe_help = "show a topic's queues"
    p = topics.command("describe", describe_help, cmd_topics_describe, DESCRIBE_DESCRIPTION)
    p.add_argument("name", metavar="NAME")
    delete_help = "delete a topic, its messages and its offsets"
    p = topics.command("delete", delete_help, cmd_topics_delete)
    p.add_argument("name", metavar="NAME")
    p = topics.command("add-queue", "add queues to a topic", cmd_topics_add_queue)
    p.add_argument("name", metavar="NAME")
    p.add_argument("--count", type=positive_int, default=1, metavar="N", help="default 1")
    add_help = "with --namesrv: the brokers to add N queues on each (default: the topic's)"
    p.add_argument("--brokers", metavar="NAME[,NAME...]", help=add_help)
    visibility_help = "hide a queue from producers and/or consumers, or show it"
    p = topics.command("set-visibility", visibility_help, cmd_topics_set_visibility)
    p.add_argument("name", metavar="NAME")
    p.add_argument("queue", type=non_negative_int, metavar="QUEUE")
    p.add_argument("--producer", type=on_off, metavar="on|off")
    p.add_argument("--on-broker", metavar="NAME", help="with --namesrv: the queue's broker")
    p.add_argument("--consumer", type=on_off, metavar="on|off")
    delete_queue_help = "delete a queue (hidden from both sides, fully consumed)"
    p = topics.command("delete-queue", delete_queue_help, cmd_topics_delete_queue)
    p.add_argument("name", metavar="NAME")
    p.add_argument("queue", type=non_negative_int, metavar="QUEUE")
    p.add_argument("--on-broker", metavar="NAME", help="with --namesrv: the queue's broker")
    force_help = "delete it even if a group has not consumed all of it: drops those messages"
    p.add_argument("--force", action="store_true", help=force_help)

"""Arguments of ``equeue schema``: set, get, check, compatibility, delete, sync."""

from __future__ import annotations

from equeue_spark.cli.arguments import Commands, positive_int
from equeue_spark.cli.commands.schemas import (
    RULES,
    cmd_schema_check,
    cmd_schema_compatibility,
    cmd_schema_delete,
    cmd_schema_get,
    cmd_schema_set,
    cmd_schema_sync,
)

SET_DESCRIPTION = (
    "Register a version of the topic's value (--key: key) schema, Avro or JSON Schema,\n"
    "read from FILE ('-': stdin). The broker checks it against the subject's\n"
    "compatibility rule (BACKWARD unless set): an incompatible schema exits 1 listing\n"
    "the problems, one per line. A schema equal to an existing version registers\n"
    "nothing and names that version. With --namesrv every broker group of the topic\n"
    "gets the same version number."
)
KEY_HELP = "the key schema (default: the value schema)"
FILE_HELP = "the schema's file (Avro .avsc or JSON Schema); '-' reads stdin"


def add_schemas(commands: Commands) -> None:
    schema = commands.group("schema", "set, get and check a topic's value and key schemas")
    p = schema.command("set", "register a schema version", cmd_schema_set, SET_DESCRIPTION)
    p.add_argument("topic", metavar="TOPIC")
    p.add_argument("file", metavar="FILE", help=FILE_HELP)
    p.add_argument("--key", action="store_true", help=KEY_HELP)
    type_help = "the schema's type (default: guessed from the document)"
    p.add_argument("--type", choices=("avro", "json"), default="", help=type_help)
    rule_help = f"set the subject's compatibility rule with it ({', '.join(RULES)})"
    p.add_argument("--compatibility", metavar="RULE", help=rule_help)
    p.add_argument("--dry-run", action="store_true", help="check only, register nothing")
    get_help = "print a schema version (the latest by default), or the history"
    p = schema.command("get", get_help, cmd_schema_get)
    p.add_argument("topic", metavar="TOPIC")
    p.add_argument("--key", action="store_true", help=KEY_HELP)
    p.add_argument("--version", type=positive_int, default=0, metavar="N", help="version N")
    p.add_argument("--history", action="store_true", help="every version, oldest first")
    check_help = "check a schema against the topic's rule without registering it"
    p = schema.command("check", check_help, cmd_schema_check)
    p.add_argument("topic", metavar="TOPIC")
    p.add_argument("file", metavar="FILE", help=FILE_HELP)
    p.add_argument("--key", action="store_true", help=KEY_HELP)
    p.add_argument("--type", choices=("avro", "json"), default="", help=type_help)
    compatibility_help = "change a subject's compatibility rule"
    p = schema.command("compatibility", compatibility_help, cmd_schema_compatibility)
    p.add_argument("topic", metavar="TOPIC")
    p.add_argument("rule", metavar="RULE", help=", ".join(RULES))
    p.add_argument("--key", action="store_true", help=KEY_HELP)
    delete_help = "forget a topic's value schema (records keep their version headers)"
    p = schema.command("delete", delete_help, cmd_schema_delete)
    p.add_argument("topic", metavar="TOPIC")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--key", action="store_true", help="the key schema instead")
    which.add_argument("--all", action="store_true", help="the value and the key schemas")
    sync_help = "give broker groups that lag the schema versions they lack (--namesrv)"
    p = schema.command("sync", sync_help, cmd_schema_sync)
    p.add_argument("topic", metavar="TOPIC")

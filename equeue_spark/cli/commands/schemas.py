"""``equeue schema``: a topic's value and key schemas (client/schema_admin.py)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import cast

from equeue_proto.v1 import broker_pb2 as pb
from equeue_spark.cli.common import CliError, UsageError, admin_client
from equeue_spark.cli.formatting import (
    Output,
    format_partial,
    format_table,
    format_time,
    proto_dict,
)
from equeue_spark.client.errors import SchemaIncompatibleError
from equeue_spark.client.schema_admin import RULES, rule_name, subject, type_name

__all__ = [
    "RULES",
    "cmd_schema_check",
    "cmd_schema_compatibility",
    "cmd_schema_delete",
    "cmd_schema_get",
    "cmd_schema_set",
    "cmd_schema_sync",
]


def _read(path: str) -> str:
    """FILE's text ('-': stdin); a file that cannot be read is a usage error."""
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as f:
                text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read schema file {path!r}: {exc}") from None
    if not text.strip():
        raise CliError(f"{'the input' if path == '-' else path} is empty: give the schema text")
    return text


def _pretty(text: str) -> str:
    try:
        return json.dumps(json.loads(text), indent=2)
    except ValueError:
        return text


def _partial(ui: Output, info: pb.SchemaInfo) -> None:
    if info.unreachable_brokers:
        what = "they did not get it: run equeue schema sync once they are back"
        ui.line(format_partial(info.unreachable_brokers, {}, what))


def _version_of(info: pb.SchemaInfo) -> pb.SchemaVersion:
    return info.versions[-1] if info.versions else pb.SchemaVersion()


def info_dict(info: pb.SchemaInfo) -> dict[str, object]:
    """``SchemaInfo`` for ``--json``: the rule and types by name ("BACKWARD",
    "AVRO"), not the proto's enum numbers a script would have to know."""
    out = proto_dict(info)
    out["compatibility"] = rule_name(info.compatibility) or None
    for shown, version in zip(
        cast("list[dict[str, object]]", out["versions"]), info.versions, strict=True
    ):
        shown["type"] = type_name(version.type)
    return out


def _refused(topic: str, key: bool, exc: SchemaIncompatibleError) -> CliError:
    """Exit 1 with every incompatibility on a line of its own."""
    lines = "\n".join(f"  {p}" for p in exc.problems)
    return CliError(f"{topic}: {subject(key)} schema refused as incompatible:\n{lines}")


def cmd_schema_set(args: argparse.Namespace, ui: Output) -> None:
    text = _read(args.file)
    with admin_client(args) as admin:
        try:
            info = admin.set_schema(
                args.topic, text, type=args.type, key=args.key,
                compatibility=args.compatibility, dry_run=args.dry_run,
            )  # fmt: skip
        except SchemaIncompatibleError as exc:
            if ui.json:  # the problems as a document too, as schema check prints them
                ui.document({"topic": args.topic, "key": args.key, "created": False,
                             "problems": list(exc.problems)})  # fmt: skip
            raise _refused(args.topic, args.key, exc) from None
    if args.dry_run:
        _checked(args, ui, info)
        return
    if ui.json:
        ui.document(info_dict(info))
        return
    version = _version_of(info)
    what = f"{args.topic}: {subject(args.key)} schema"
    if info.created:
        rule = rule_name(info.compatibility)
        ui.line(f"{what} version {version.version} registered ({type_name(version.type)}, {rule})")
    else:
        ui.line(f"{what} already version {version.version}")
    _partial(ui, info)


def cmd_schema_check(args: argparse.Namespace, ui: Output) -> None:
    text = _read(args.file)
    with admin_client(args) as admin:
        info = admin.set_schema(args.topic, text, type=args.type, key=args.key, dry_run=True)
    _checked(args, ui, info)


def _checked(args: argparse.Namespace, ui: Output, info: pb.SchemaInfo) -> None:
    """A dry run's outcome: compatible (exit 0) or the problems (exit 1)."""
    if ui.json:
        ui.document(info_dict(info))
    if info.problems:
        lines = "\n".join(f"  {p}" for p in info.problems)
        raise CliError(f"{args.topic}: {subject(args.key)} schema is incompatible:\n{lines}")
    if not ui.json:
        rule = rule_name(info.compatibility) or "the rule"
        ui.line(f"{args.topic}: {subject(args.key)} schema is compatible ({rule})")


def cmd_schema_get(args: argparse.Namespace, ui: Output) -> None:
    with admin_client(args) as admin:
        info = admin.get_schema(args.topic, args.version, key=args.key, history=args.history)
    if ui.json:
        ui.document(info_dict(info))
        return
    if not args.history:
        ui.line(_pretty(_version_of(info).schema))
        return
    rule = rule_name(info.compatibility)
    ui.line(f"{args.topic}: {subject(args.key)} schema, compatibility {rule}")
    rows = [
        (v.version, type_name(v.type), v.fingerprint, format_time(v.created_ms))
        for v in info.versions
    ]
    ui.line(format_table(("VERSION", "TYPE", "FINGERPRINT", "CREATED"), rows))
    for v in info.versions:
        ui.line(f"\nversion {v.version}:\n{_pretty(v.schema)}")


def cmd_schema_compatibility(args: argparse.Namespace, ui: Output) -> None:
    with admin_client(args) as admin:
        info = admin.set_compatibility(args.topic, args.rule, key=args.key)
    if ui.json:
        ui.document(info_dict(info))
        return
    ui.line(f"{args.topic}: {subject(args.key)} compatibility {rule_name(info.compatibility)}")
    _partial(ui, info)


def cmd_schema_delete(args: argparse.Namespace, ui: Output) -> None:
    key: bool | None = None if args.all else args.key
    with admin_client(args) as admin:
        unreachable = admin.delete_schemas(args.topic, key=key)
    which = "value and key schemas" if key is None else f"{subject(bool(key))} schema"
    if ui.json:
        ui.document({"topic": args.topic, "deleted": which, "unreachable_brokers": unreachable})
        return
    ui.line(f"{args.topic}: {which} deleted")
    if unreachable:
        ui.line(format_partial(unreachable, {}, "theirs are not deleted: delete again later"))


def cmd_schema_sync(args: argparse.Namespace, ui: Output) -> None:
    with admin_client(args) as admin:
        copied = admin.sync_schemas(args.topic)
    if ui.json:
        ui.document({"topic": args.topic, "copied": copied})
        return
    if not any(copied.values()):
        ui.line(f"{args.topic}: every broker group has every schema version")
    for which, groups in copied.items():
        for broker, versions in sorted(groups.items()):
            if which.endswith("_rule"):  # the rule of the group with the longest history
                rule = rule_name(versions[0])
                name = which.removesuffix("_rule")
                ui.line(f"{args.topic}: broker group {broker} given {name} compatibility {rule}")
                continue
            listed = ", ".join(str(v) for v in versions)
            ui.line(f"{args.topic}: broker group {broker} given {which} versions {listed}")

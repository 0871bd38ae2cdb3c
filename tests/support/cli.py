"""Running the ``equeue`` command in-process against a broker, for the CLI tests."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from equeue_spark.cli import main


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        assert self.code == 0, self.err
        return json.loads(self.out)

    def json_lines(self) -> list[dict[str, Any]]:
        assert self.code == 0, self.err
        return [json.loads(line) for line in self.out.splitlines()]


Cli = Callable[..., Result]


def in_process_cli(address: str, capsys: pytest.CaptureFixture[str]) -> Cli:
    """``cli(*ARGS)`` runs ``equeue --broker ADDRESS --timeout-s 10 ARGS`` in this
    process: its exit code and output."""

    def run(*args: str) -> Result:
        code = main(["--broker", address, "--timeout-s", "10", *args])
        out, err = capsys.readouterr()
        return Result(code, out, err)

    return run

"""A producer process for the transaction check-back tests (run as a subprocess).

``python -m tests.support.txn_producer TARGET GROUP [options]``

TARGET is a broker address or ``namesrv=HOST:PORT,...`` (a cluster).
``--stage TXN --topic T [--count N] [--broker NAME]`` stages N messages
(``m0`` ...) in transaction TXN with producer group GROUP and prints
``STAGED``; it never commits. ``--checker MODE`` answers the broker's checks:
``commit``, ``rollback``, ``unknown``, ``unknown-then-commit`` (unknown twice,
then commit) or ``raise-then-commit`` (raises twice, then commit); each call
prints ``CHECK <txn> <call number>``. It prints ``READY`` and runs until
killed (the tests SIGKILL it, as a crash).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import threading
from collections.abc import Callable

from equeue_spark.client import ClientConfig, Producer

ANSWERS: dict[str, Callable[[int], str]] = {
    "commit": lambda n: "commit",
    "rollback": lambda n: "rollback",
    "unknown": lambda n: "unknown",
    "unknown-then-commit": lambda n: "unknown" if n <= 2 else "commit",
}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("target")
    parser.add_argument("group")
    parser.add_argument("--stage", default="")
    parser.add_argument("--topic", default="orders")
    parser.add_argument("--count", type=int, default=10)
    parser.add_argument("--broker", default="")
    parser.add_argument("--checker", default="")
    args = parser.parse_args()
    if args.target.startswith("namesrv="):
        config = ClientConfig(namesrv=args.target.partition("=")[2])
    else:
        config = ClientConfig(broker=args.target)
    calls = itertools.count(1)
    lock = threading.Lock()

    def checker(txn_id: str) -> str:
        with lock:
            n = next(calls)
        print(f"CHECK {txn_id} {n}", flush=True)
        if args.checker == "raise-then-commit":
            if n <= 2:
                raise RuntimeError("the application's database is down")
            return "commit"
        return str(ANSWERS[args.checker](n))

    producer = Producer(config=config, group=args.group, checker=checker if args.checker else None)
    if args.stage:
        values = [f"m{i}".encode() for i in range(args.count)]
        producer.transaction(args.stage, broker=args.broker).send_batch(args.topic, values)
        print("STAGED", flush=True)
    print("READY", flush=True)
    threading.Event().wait()  # until killed
    return 0


if __name__ == "__main__":
    sys.exit(main())

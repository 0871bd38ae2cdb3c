"""One election member in a process of its own, for tests that SIGSTOP or SIGKILL it.

    python -m tests.support.election_member HOSTS GROUP BROKER_ID SESSION_TIMEOUT_S

Prints one JSON line per role change on stdout (``{"role": "master", "epoch": 2}``,
``{"role": "replica", "master": "b", "epoch": 2}``, ``{"role": "replica",
"master": null, "epoch": null}``), after ``{"ready": true}`` once it has joined.
"""

from __future__ import annotations

import json
import sys
import threading

from equeue_broker.replication.election import Epoch, GroupElection


def say(fields: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def main() -> None:
    hosts, group, broker_id, session_timeout_s = sys.argv[1:5]

    def on_master(epoch: Epoch) -> None:
        say({"role": "master", "epoch": epoch.epoch})

    def on_replica(epoch: Epoch | None) -> None:
        say(
            {
                "role": "replica",
                "master": epoch.master_id if epoch else None,
                "epoch": epoch.epoch if epoch else None,
            }
        )

    election = GroupElection(
        hosts,
        group,
        broker_id,
        f"{broker_id}.example:9000",
        lambda: 0,
        on_master=on_master,
        on_replica=on_replica,
        session_timeout_s=float(session_timeout_s),
        recheck_s=1.0,
    )
    election.start()
    say({"ready": True})
    threading.Event().wait()  # until killed


if __name__ == "__main__":
    main()

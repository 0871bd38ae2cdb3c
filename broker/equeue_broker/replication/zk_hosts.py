"""The ``--zookeeper`` address: parsed without importing kazoo.

Apart from election.py so that checking the flag (server/config.py) does not
load the ZooKeeper client, which a broker without ``--zookeeper`` never uses.
"""

from __future__ import annotations


def parse_hosts(spec: str) -> tuple[str, str]:
    """``HOST:PORT[,HOST:PORT...][/chroot]`` -> (hosts, chroot without a trailing /).

    The chroot is applied as a path prefix here rather than by kazoo, so that
    it need not exist beforehand."""
    hosts, slash, chroot = spec.partition("/")
    if not hosts or any(not h.rpartition(":")[2].isdigit() for h in hosts.split(",")):
        raise ValueError(f"--zookeeper wants HOST:PORT[,HOST:PORT...][/chroot], not {spec!r}")
    return hosts, ("/" + chroot.strip("/")) if slash and chroot.strip("/") else ""

from typing import NamedTuple

class KazooState:
    SUSPENDED: str
    CONNECTED: str
    LOST: str

class EventType:
    CREATED: str
    DELETED: str
    CHANGED: str
    CHILD: str
    NONE: str

class WatchedEvent(NamedTuple):
    type: str
    state: str
    path: str

class ZnodeStat(NamedTuple):
    czxid: int
    mzxid: int
    ctime: int
    mtime: int
    version: int
    cversion: int
    aversion: int
    ephemeralOwner: int  # noqa: N815 (ZooKeeper's name)
    dataLength: int  # noqa: N815
    numChildren: int  # noqa: N815
    pzxid: int

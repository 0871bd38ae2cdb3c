"""What a store found damaged at open and does not serve, for stats and logs.

A sealed log chunk whose header or footer fails its checks is *quarantined*
(message_log.py): the broker starts and serves every other chunk, and reads
of the quarantined chunk's records fail with ``CorruptionError`` (DATA_LOSS)
naming the topic, queue and offset. Consumer offsets whose file and backup are
both damaged are *lost* (offsets.py). Both are found again at every open until
an operator repairs them: ``equeue-broker verify`` lists every damaged chunk,
record and metadata file of a stopped broker's data directory (verify.py).
With topics.json the topics are rebuilt from the index directories (topics.py);
with txn/sinks.json each sink's last committed batch is forgotten; with
schemas.json every topic's schemas (meta/schemas.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from equeue_broker.storage.meta.offsets import LostOffsets


@dataclass(frozen=True)
class QuarantinedChunk:
    path: Path
    number: int
    start_position: int
    """Log position of the chunk's first byte of data."""
    end_position: int
    """Log position past its data (as far as its file's size tells)."""
    reason: str


@dataclass(frozen=True)
class Damage:
    quarantined_chunks: list[QuarantinedChunk]
    offsets_lost: LostOffsets | None
    lost_metadata: list[str]
    """What was lost with other metadata files found with no intact copy at open
    (topics.json: rebuilt from the indexes; schemas.json: every schema;
    txn/sinks.json: sink progress)."""

    def metadata(self) -> list[str]:
        """One line per metadata file that has no intact copy."""
        lines = list(self.lost_metadata)
        if self.offsets_lost is not None:
            reason = self.offsets_lost.reason
            lines.insert(0, f"offsets.json: consumer offsets lost ({reason}); reset every group")
        return lines

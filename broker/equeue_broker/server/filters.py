"""Filter expressions of pulls: compiled once per text, and what a pull left out.

A pull or pull stream names its filter as text (``PullRequest.filter``);
parsing it for every pull of a busy consumer would cost more than many reads,
so compiled selectors are kept by text in a small LRU. A text that does not
parse is a ``BadFilter`` (INVALID_ARGUMENT naming the position); bad texts are
not cached, so junk cannot evict the good ones.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Awaitable, Callable

from equeue_broker.server.errors import BadFilter
from equeue_broker.storage import ReadStatus, RecordsResult
from equeue_proto.selector import Selector, SelectorError, parse

CACHE_SIZE = 256
"""Compiled selectors kept (by text)."""


class Selectors:
    """An LRU of compiled selectors by expression text (thread-safe: reads run on
    the event loop and the thread pool)."""

    def __init__(self, size: int = CACHE_SIZE) -> None:
        self._size = size
        self._lock = threading.Lock()
        self._cache: collections.OrderedDict[str, Selector] = collections.OrderedDict()

    def cached(self, text: str) -> Selector | None:
        """The selector of ``text`` if compiled already, else None."""
        with self._lock:
            found = self._cache.get(text)
            if found is not None:
                self._cache.move_to_end(text)
            return found

    async def compiled(
        self, text: str, call: Callable[..., Awaitable[Selector | None]]
    ) -> Selector | None:
        """``get``, but a text not compiled yet is parsed by ``call`` (the thread
        pool): a 4 KiB expression takes milliseconds the event loop must not."""
        if not text:
            return None
        return self.cached(text) or await call(self.get, text)

    def get(self, text: str) -> Selector | None:
        """The selector of ``text`` (None for no filter: an empty text)."""
        if not text:
            return None
        with self._lock:
            found = self._cache.get(text)
            if found is not None:
                self._cache.move_to_end(text)
                return found
        try:
            selector = parse(text)
        except SelectorError as exc:
            raise BadFilter(str(exc)) from None
        with self._lock:
            self._cache[text] = selector
            while len(self._cache) > self._size:
                self._cache.popitem(last=False)
        return selector

    def __len__(self) -> int:
        return len(self._cache)


def left_out(result: RecordsResult, offset: int) -> int:
    """Records a read from ``offset`` inspected and did not return (its tags or
    filter left them out): the offsets it moved past, less the records it sent."""
    if result.status is not ReadStatus.OK:
        return 0
    return max(0, result.next_offset - offset - result.count)

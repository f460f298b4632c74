"""The responses a server keeps (``store``, the default) for ``previous_response_id`` and ``GET``/``DELETE
/v1/responses/{id}``: each response with the conversation that led to it, in memory, bounded and expiring."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from turnkit.serve.protocol import APIError

__all__ = ["ResponseStore", "StoredResponse"]


@dataclass
class StoredResponse:
    """A kept response, the conversation that led to it, and when it expires."""

    response: dict[str, Any]
    conversation: list[dict[str, Any]]  # the messages it continued and its own reply (without its instructions)
    expires: float


class ResponseStore:
    """Responses kept for ``previous_response_id`` and ``GET``: at most ``size``, each for ``ttl_s`` seconds, the
    oldest dropped first (in memory: a restart forgets them, as the OpenAI API forgets ``store: false`` ones)."""

    def __init__(self, size: int = 1024, ttl_s: float = 3600.0) -> None:
        self.size, self.ttl_s = size, ttl_s
        self._items: OrderedDict[str, StoredResponse] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, response: dict[str, Any], conversation: list[dict[str, Any]]) -> None:
        with self._lock:
            self._items[response["id"]] = StoredResponse(response, conversation, time.monotonic() + self.ttl_s)
            while len(self._items) > self.size:
                self._items.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            item = self._items.get(response_id)
            if item is not None and item.expires < time.monotonic():
                del self._items[response_id]
                return None
            return item

    def delete(self, response_id: str) -> bool:
        with self._lock:
            return self._items.pop(response_id, None) is not None

    def found(self, response_id: str, param: str = "response_id") -> StoredResponse:
        item = self.get(response_id)
        if item is None:
            raise APIError(
                404 if param == "response_id" else 400,
                f"no response with id {response_id!r} is stored (it expired, was deleted, was made with store: "
                "false, or the server restarted)",
                param=param,
                code="response_not_found",
            )
        return item

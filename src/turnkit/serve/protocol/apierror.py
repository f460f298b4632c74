"""The error object of the one path: every problem with a request becomes an :class:`~turnkit.errors.APIError`
(defined in :mod:`turnkit.errors`, with every other error), with an HTTP status and a message that names the field.
Each API writes it in its own error shape and in its own words (:mod:`.wording`); this module turns what turnkit
refused in a request into one.
"""

from __future__ import annotations

from turnkit.errors import APIError, TurnkitError

__all__ = ["APIError", "as_api_error"]


def as_api_error(exc: TurnkitError) -> APIError:
    """A 400 for what turnkit refused in a request; ``param`` is the error's location (``messages[i].field``)."""
    reason = getattr(exc, "reason", None)
    return APIError(400, str(exc), param=exc.location, reason=reason if isinstance(reason, str) else None)

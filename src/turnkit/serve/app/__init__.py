"""The HTTP app of ``turnkit serve``: :mod:`.routes` (the :class:`~.routes.Server` and its endpoints), :mod:`.inflight`
(every request watched: a client that leaves stops its generation; requests in flight), :mod:`.lifecycle` (uvicorn,
SIGTERM, the drain with a deadline), :mod:`.metrics` (``/metrics``), :mod:`.auth` (the API key), :mod:`.errors` (every
failure as an error object, with ``Retry-After``), :mod:`.body` (body limits; large bodies off the event loop),
:mod:`.sse` (server-sent events) and :mod:`.ui` (the playground page). Nothing outside the command line imports it."""

"""The HTTP app of ``turnkit serve``: :mod:`.routes` (the :class:`~.routes.Server` and its endpoints), :mod:`.auth`
(the API key), :mod:`.errors` (every failure as an error object), :mod:`.body` (body limits), :mod:`.sse` (server-sent
events) and :mod:`.ui` (the playground page). Nothing outside the command line imports it."""

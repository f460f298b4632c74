"""A trajectory driven against an engine's token-id route: one call samples a reply and appends it.

Agent RL needs the ids the policy sampled, not a re-encoding of their text (:mod:`turnkit.trajectory` says why). Most
engines already take a prompt as ids and give back the ids they sampled, each under its own names; this module holds
those names, so that a training loop writes ``client.sample(traj)`` and never a chat request:

* :data:`TURNKIT` and :data:`VLLM`: the OpenAI-style ``POST /v1/completions`` with ``prompt`` as a list of ids,
  ``return_token_ids: true`` (vLLM's field: each choice's ``token_ids``, and ``prompt_token_ids``, in the choice on
  vLLM, at the top on turnkit serve) and
  ``logprobs: 1``. vLLM is also told to stop on the trajectory format's stop ids (``stop_token_ids``); turnkit serve
  stops on its template's own stops, the same ids, without being told (it takes the field too). Both are sent the
  trajectory's own :attr:`~turnkit.trajectory.Trajectory.stop_token_ids` in that field.
* :data:`LLAMA_SERVER`: llama.cpp's ``llama-server`` ``POST /completion`` (``prompt`` as ids, ``n_predict``,
  ``return_tokens: true``, ``n_probs: 1``); it stops on the model's end-of-generation ids, having no per-request
  stop-id field, and returns the stop id in ``tokens`` with its log-probability (run against llama.cpp's server
  built from the pinned llama-cpp-python sdist). A trajectory's own stop ids it cannot be told: its answer is cut
  after the first of them (what it sampled up to there is what an engine that stops there samples).
* :data:`SGLANG`: SGLang's ``POST /generate`` (``input_ids``, ``sampling_params``, ``return_logprob: true``), written
  from its documentation: SGLang does not run on a CPU without its kernels.

A route is data (:class:`Route`: a name, a path, a function that writes the body and one that reads the answer), not
a subclass: an engine that spells it differently is ``dataclasses.replace(VLLM, path=...)`` or a new ``Route``.

What comes back is checked before the trajectory takes it, since a wrong id here is silent damage in training: no ids
(an engine without ``return_token_ids``) or an HTTP error raise :class:`~turnkit.errors.EngineReplyError` naming the
route and the missing field; log-probabilities are aligned one to one with the ids (by the ids the engine names with
them where it does); and where the engine echoes the prompt ids it was given, they must be the trajectory's.

Only the standard library is used (``urllib``): turnkit's core installs no HTTP client.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from turnkit.errors import EngineReplyError

if TYPE_CHECKING:
    from turnkit.parse.reply import Reply
    from turnkit.trajectory import Trajectory

__all__ = ["LLAMA_SERVER", "ROUTES", "SGLANG", "TURNKIT", "VLLM", "Answer", "EngineClient", "Route", "Sample"]


@dataclass(frozen=True)
class Answer:
    """What a route reads off an engine's answer: the sampled ids; per id, the engine's log-probability as
    ``(id the engine names with it or None, logprob or None)``, or ``None`` when it sent none; the prompt ids the
    engine says it was given (``None`` where it does not say); its finish reason as it wrote it."""

    ids: list[int]
    logprobs: list[tuple[int | None, float | None]] | None
    prompt_ids: list[int] | None = None
    finish_reason: str | None = None


#: ``(prompt ids, stop ids, max tokens, sampling fields) -> JSON body``
BodyWriter = Callable[[list[int], list[int], int, Mapping[str, Any]], dict[str, Any]]
#: ``(route name, JSON answer) -> Answer``; raises :class:`EngineReplyError` where a field is missing
AnswerReader = Callable[[str, Any], Answer]


@dataclass(frozen=True)
class Route:
    """One engine's token-id route: ``name`` (for errors), ``path`` (after the base URL), ``body`` (writes the
    request) and ``read`` (reads the answer). ``needs_model``: the body names the served model (the client asks
    ``/v1/models`` once when it was not given one)."""

    name: str
    path: str
    body: BodyWriter
    read: AnswerReader
    needs_model: bool = False


@dataclass(frozen=True)
class Sample:
    """One sampled reply, as appended: ``ids`` and ``logprobs`` (``nan`` where the engine gave none, as a
    trajectory's rows write it) went to ``traj.add_reply``, which returned ``reply``; ``prompt_ids`` are the ids sent;
    ``engine_prompt_ids`` those the engine says it was given (checked equal; ``None`` where it does not say);
    ``finish_reason`` the engine's (``stop`` where its answer was cut at the trajectory's own stop id); ``response``
    its whole JSON answer."""

    ids: list[int]
    logprobs: list[float]
    reply: Reply
    prompt_ids: list[int]
    engine_prompt_ids: list[int] | None
    finish_reason: str | None
    response: Any


# -- the routes ------------------------------------------------------------------------------------------------------


def _field(route: str, value: Any, path: str, kind: type | tuple[type, ...], why: str = "") -> Any:
    """``value`` at ``path`` (``choices[0].token_ids``), of type ``kind``; else an error naming what is missing."""
    node = value
    for part in path.replace("[", ".").replace("]", "").split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            node = None
            break
    if node is None or not isinstance(node, kind) or isinstance(node, bool):
        raise EngineReplyError(route, f"the answer has no {path}{why}", missing=path)
    return node


def _ids(route: str, value: Any, path: str, why: str = "") -> list[int]:
    ids = _field(route, value, path, list, why)
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise EngineReplyError(route, f"{path} holds something other than token ids", missing=path)
    return ids


def _openai_body(stop_field: str | None) -> BodyWriter:
    def body(prompt: list[int], stop: list[int], max_tokens: int, sampling: Mapping[str, Any]) -> dict[str, Any]:
        out = {"prompt": prompt, "max_tokens": max_tokens, "logprobs": 1, "return_token_ids": True, **sampling}
        if stop_field and stop:
            out[stop_field] = stop
        return out

    return body


def _openai_read(route: str, answer: Any) -> Answer:
    why = " (an engine without return_token_ids, vLLM's field, which turnkit serve has too)"
    ids = _ids(route, answer, "choices[0].token_ids", why)
    logprobs: list[tuple[int | None, float | None]] | None = None
    values = (answer["choices"][0].get("logprobs") or {}).get("token_logprobs")
    if isinstance(values, list):
        logprobs = [(None, value) for value in values]
    # vLLM's completions echo the prompt in each choice (a request may hold several prompts); turnkit serve's at the
    # top, as both do for chat
    prompt = answer["choices"][0].get("prompt_token_ids") or answer.get("prompt_token_ids")
    return Answer(
        ids, logprobs, prompt if isinstance(prompt, list) else None, answer["choices"][0].get("finish_reason")
    )


def _llama_body(prompt: list[int], stop: list[int], max_tokens: int, sampling: Mapping[str, Any]) -> dict[str, Any]:
    # no per-request stop-id field: llama-server ends on the model's end-of-generation ids (stop strings aside)
    return {"prompt": prompt, "n_predict": max_tokens, "return_tokens": True, "n_probs": 1, **sampling}


def _llama_read(route: str, answer: Any) -> Answer:
    ids = _ids(route, answer, "tokens", " (llama-server returns them with return_tokens)")
    probs = answer.get("completion_probabilities")
    logprobs = None
    if isinstance(probs, list):
        logprobs = [(entry.get("id"), entry.get("logprob")) for entry in probs if isinstance(entry, dict)]
    return Answer(ids, logprobs, None, answer.get("stop_type"))


def _sglang_body(prompt: list[int], stop: list[int], max_tokens: int, sampling: Mapping[str, Any]) -> dict[str, Any]:
    params = {"max_new_tokens": max_tokens, **sampling}
    if stop:
        params["stop_token_ids"] = stop
    return {"input_ids": prompt, "sampling_params": params, "return_logprob": True}


def _sglang_read(route: str, answer: Any) -> Answer:
    if isinstance(answer, list) and len(answer) == 1:
        answer = answer[0]
    ids = _ids(route, answer, "output_ids")
    meta = answer.get("meta_info") or {}
    finish = meta.get("finish_reason")
    matched = finish.get("matched") if isinstance(finish, dict) else None
    if isinstance(matched, int) and not isinstance(matched, bool) and ids[-1:] != [matched]:
        ids = [*ids, matched]  # a stop id the engine sampled and left out of output_ids: the turn's end
    entries = meta.get("output_token_logprobs")
    logprobs = None
    if isinstance(entries, list):
        logprobs = [(entry[1], entry[0]) for entry in entries if isinstance(entry, list | tuple) and len(entry) >= 2]
    return Answer(ids, logprobs, None, finish.get("type") if isinstance(finish, dict) else None)


#: turnkit serve's ``/v1/completions``: stops on the template's own stops without being told them; told the
#: trajectory's own stop ids, and any the client is given, in vLLM's field.
TURNKIT = Route("turnkit serve /v1/completions", "/v1/completions", _openai_body("stop_token_ids"), _openai_read, True)
#: vLLM's ``/v1/completions`` (and any server of vLLM's shape), told the trajectory's stop ids.
VLLM = Route("vLLM /v1/completions", "/v1/completions", _openai_body("stop_token_ids"), _openai_read, True)
#: llama.cpp's ``llama-server`` ``/completion``, its native route (ids in, ``tokens`` out).
LLAMA_SERVER = Route("llama-server /completion", "/completion", _llama_body, _llama_read)
#: SGLang's native ``/generate``.
SGLANG = Route("SGLang /generate", "/generate", _sglang_body, _sglang_read)
#: The routes by a short name (``EngineClient(url, "vllm")``).
ROUTES: dict[str, Route] = {"turnkit": TURNKIT, "vllm": VLLM, "llama-server": LLAMA_SERVER, "sglang": SGLANG}


def _cut_at_stop(answer: Answer, stops: frozenset[int]) -> Answer:
    """The answer up to and with the first id of ``stops`` (a trajectory's own stop ids), as an engine that was told
    them ends it: one that has no field for them (llama-server) samples on, and no id sampled before depends on the
    ids after, so the cut is what it would have sampled; its finish reason is then ``stop``."""
    at = next((position for position, token_id in enumerate(answer.ids) if token_id in stops), None)
    if at is None or at == len(answer.ids) - 1:
        return answer
    logprobs = None if answer.logprobs is None else answer.logprobs[: at + 1]
    return Answer(answer.ids[: at + 1], logprobs, answer.prompt_ids, "stop")


def _aligned(route: str, answer: Answer) -> list[float]:
    """One log-probability per sampled id (``nan`` where the engine gave none). An engine may leave out the last id's
    (turnkit serve and OpenAI give none for the stop id); any other difference in count, or an entry naming another
    id than the one at its place, is an error: misaligned log-probabilities would train the wrong tokens."""
    ids, entries = answer.ids, answer.logprobs
    assert entries is not None
    if not len(ids) - 1 <= len(entries) <= len(ids):
        raise EngineReplyError(
            route, f"{len(entries)} log-probabilities for {len(ids)} sampled ids", missing="logprobs"
        )
    out = []
    for position, (named, value) in enumerate(entries):
        if named is not None and named != ids[position]:
            raise EngineReplyError(
                route, f"the log-probability at {position} is for id {named}, the id sampled there is {ids[position]}"
            )
        out.append(math.nan if value is None else float(value))
    return out + [math.nan] * (len(ids) - len(entries))


# -- the client ------------------------------------------------------------------------------------------------------


class EngineClient:
    """Samples a trajectory's replies from an engine's token-id route.

    ``base_url`` is the server's (``http://127.0.0.1:8000``); ``route`` a :class:`Route` or a name of
    :data:`ROUTES`; ``model`` the served model's name where the route needs one (asked of ``/v1/models`` once if
    not given); ``stop_ids`` the trajectory format's (``fmt.stop_ids``), sent where the route has a field for them,
    with each trajectory's own ``stop_token_ids``;
    ``max_tokens`` the budget of a reply; ``sampling`` fields sent as they are (``temperature``, ``seed``: each
    engine's own names); ``logprobs=False`` accepts an answer without log-probabilities (the rows then hold ``nan``).
    """

    def __init__(
        self,
        base_url: str,
        route: Route | str = TURNKIT,
        *,
        model: str | None = None,
        stop_ids: Iterable[int] = (),
        max_tokens: int = 512,
        api_key: str | None = None,
        timeout: float = 600.0,
        logprobs: bool = True,
        **sampling: Any,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.route = ROUTES[route] if isinstance(route, str) else route
        self.model = model
        self.stop_ids = sorted(int(i) for i in stop_ids)
        self.max_tokens = max_tokens
        self.sampling = sampling
        self.logprobs = logprobs
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._timeout = timeout

    def sample(self, traj: Trajectory, *, max_tokens: int | None = None, **sampling: Any) -> Sample:
        """Sample one reply from ``traj.prompt_ids`` and append it (``traj.add_reply``); per call, ``max_tokens``
        and ``sampling`` fields override the client's. The trajectory is unchanged if the engine fails."""
        prompt = traj.prompt_ids
        route = self.route
        fields = {**self.sampling, **sampling}
        if route.needs_model:
            fields = {"model": self._served_model(), **fields}
        stops = sorted({*self.stop_ids, *traj.stop_token_ids})
        answer_json = self._request(route.path, route.body(prompt, stops, max_tokens or self.max_tokens, fields))
        answer = _cut_at_stop(route.read(route.name, answer_json), frozenset(traj.stop_token_ids))
        if not answer.ids:
            raise EngineReplyError(route.name, "the engine sampled no id", missing="ids")
        if answer.prompt_ids is not None and answer.prompt_ids != prompt:
            raise EngineReplyError(
                route.name,
                f"the engine was given other ids than the trajectory's prompt ({len(answer.prompt_ids)} ids, "
                f"{len(prompt)} sent): it added or re-tokenized some",
            )
        if answer.logprobs is None:
            if self.logprobs:
                raise EngineReplyError(route.name, "the answer has no log-probabilities", missing="logprobs")
            logprobs = [math.nan] * len(answer.ids)
        else:
            logprobs = _aligned(route.name, answer)
        reply = traj.add_reply(answer.ids, logprobs)
        return Sample(answer.ids, logprobs, reply, prompt, answer.prompt_ids, answer.finish_reason, answer_json)

    def _served_model(self) -> str:
        """The model named in the body: the one given, else the first ``/v1/models`` lists (asked once)."""
        if self.model is None:
            listed = self._request("/v1/models", None)
            self.model = _field(self.route.name, listed, "data[0].id", str, " (GET /v1/models lists no model)")
        return self.model

    def _request(self, path: str, body: dict[str, Any] | None) -> Any:
        """``body`` POSTed as JSON (GET without one); the JSON answer, or an error naming the route."""
        name = self.route.name
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base_url + path, data=data, headers=self._headers)
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as response:
                text = response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            raise EngineReplyError(name, f"HTTP {exc.code} from {path}: {detail}", status=exc.code) from exc
        except (urllib.error.URLError, OSError) as exc:
            raise EngineReplyError(name, f"{self.base_url + path} could not be reached: {exc}") from exc
        try:
            return json.loads(text)
        except ValueError as exc:
            raise EngineReplyError(name, f"{path} answered something other than JSON: {text[:200]!r}") from exc

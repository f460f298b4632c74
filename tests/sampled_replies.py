"""What an engine samples under a template, for the trajectory tests: the ids the template's own render gives a
reply, cut where a checkpoint stops, and the markers it stops on, read off the template's renders (never a family's
list). A template whose render gives no reply an engine samples raises :class:`UnsampleableError`, with why.
"""

from __future__ import annotations

import re
from itertools import accumulate

import numpy as np
from roundtrip import PROBES, USER, render_rest

from turnkit import ChatFormat, EncodeError, TurnkitError
from turnkit.encode import IGNORE_INDEX
from turnkit.parse.choice.markers import first_marker, is_marker, marker_pieces, tokens

TOOLS = PROBES[0].tools


class UnsampleableError(Exception):
    """The template's own render gives no reply an engine samples: its generation prompt is not a prefix of the turn,
    or no stop id ends the turn."""


def template_sampled(fmt: ChatFormat, chat: list[dict], index: int, **kwargs) -> list[int]:
    """The ids the template's own render gives reply ``index``: the encoding of the conversation up to it, after the
    ids of its serving prompt, through its end-of-turn marker (the stop the engine samples: what the loss mask of that
    turn trains last). Where the serving prompt opens the reply's reasoning (``<think>``) and the render holds none
    (the template drops it even from the last reply), the model writes its reasoning and closes it first."""
    sampled = _turn_sampled(fmt, chat, index, **kwargs)
    reasoning = fmt.reply_format.reasoning
    if reasoning is None or reasoning.end in fmt.tokenizer.decode(sampled):
        return sampled
    prompt = fmt.tokenizer.decode(fmt.encode(chat[:index], add_generation_prompt=True, **kwargs).input_ids.tolist())
    if not prompt.rstrip().endswith(reasoning.start):
        return sampled
    thought = chat[index].get("reasoning_content") or ""
    return [*fmt.tokenizer.encode(thought + reasoning.end).ids, *sampled]


def _turn_sampled(fmt: ChatFormat, chat: list[dict], index: int, **kwargs) -> list[int]:
    prompt = fmt.encode(chat[:index], add_generation_prompt=True, **kwargs)
    prompt_ids = prompt.input_ids.tolist()
    try:
        turn = fmt.encode(chat[: index + 1], turns="last", allow_dropped=True, **kwargs)
    except EncodeError:
        # The generation prompt pre-writes text the turn's own render does not hold (``<think>\n\n</think>\n\n``
        # before a reply without reasoning): the engine samples the reply's text after it, through the first stop.
        text = fmt.render(chat[: index + 1], **kwargs)
        stops = {stop: token for token, (_, stop) in fmt.stop_ids.items()}
        rest = _after_prompt(fmt, text, prompt_ids, index)
        found = min(((rest.find(stop), stop) for stop in stops if stop in rest), default=None)
        if found is None:  # the stop is the next message's opening marker
            ids = fmt.tokenizer.encode(rest).ids
            return _with_next_opening(fmt, chat, index, ids, len(ids), **kwargs)[0]
        return [*fmt.tokenizer.encode(rest[: found[0]]).ids, stops[found[1]]]
    ids = turn.input_ids.tolist()
    trained = np.flatnonzero(turn.labels != IGNORE_INDEX)
    end = int(trained[-1]) + 1
    if ids[end - 1] not in fmt.stop_ids:
        stopped = [int(k) for k in trained if ids[k] in fmt.stop_ids]
        if stopped:  # a template's generation block trains what it writes after the stop (the "\n"): never sampled
            end = stopped[0] + 1
        else:  # the stop is the next message's opening marker (GLM's <|observation|>): the engine samples it
            ids, end = _with_next_opening(fmt, chat, index, ids, end, **kwargs)
    if ids[: len(prompt_ids)] == prompt_ids and end > len(prompt_ids):
        return ids[len(prompt_ids) : end]
    # The generation prompt ends inside a piece of text the turn's encoding splits otherwise ("\n\n" then "\n",
    # "\n<"), or pre-writes text the turn's render does not hold: the engine samples the reply's text after the
    # prompt it was given, in its own tokens.
    return fmt.tokenizer.encode(_after_prompt(fmt, fmt.tokenizer.decode(ids[:end]), prompt_ids, index)).ids


def _after_prompt(fmt: ChatFormat, text: str, prompt_ids: list[int], index: int) -> str:
    """The turn's render ``text`` after the serving prompt it starts with, or after the longest run of the prompt's
    ids it starts with when the prompt ends in pre-written text the turn does not hold, past what that text shares
    with the turn's (32 tokens at most, LongCat's `` /think_off ASSISTANT:<longcat_think>\n\n</longcat_think>\n``
    spelled in text pieces: more is a prompt the template rewrites, not a reply an engine samples)."""
    decode = fmt.tokenizer.decode
    for keep in range(len(prompt_ids), max(len(prompt_ids) - 32, 0), -1):
        head = decode(prompt_ids[:keep])
        if text.startswith(head) and len(text) > len(head):
            return _past_shared(text[len(head) :], decode(prompt_ids)[len(head) :])
    # The template writes earlier turns otherwise once the reply follows (a system message moved to the last user
    # turn): the reply is what follows the generation prompt's last tokens in the turn's render.
    for keep in range(len(prompt_ids), max(len(prompt_ids) - 16, 4), -1):
        tail = decode(prompt_ids[keep - 4 : keep])
        if tail.strip() and (at := text.rfind(tail)) >= 0 and len(text) > at + len(tail):
            return text[at + len(tail) :]
    raise UnsampleableError(f"reply {index}: the serving prompt does not begin the turn's render")


def _past_shared(rest: str, dropped: str) -> str:
    """The turn's ``rest`` after the words it shares with the prompt's ``dropped`` end, where the rest starts with a
    word of it: a thinking switch written into the user turn before the reply's header, which the turn's render
    writes without it (LongCat-Flash-Chat's `` /think_on ASSISTANT:<longcat_think>\\n``, where the reply is rendered
    `` ASSISTANT:\\n<longcat_think>\\n...``): the engine samples what follows the header and whatever the prompt wrote
    of the reply's opening, the whitespace after it too; the prompt's pre-written text the turn does not hold
    (``<longcat_think>\\n\\n</longcat_think>\\n`` before a reply without reasoning) is skipped."""
    said = [word for word in tokens(dropped) if not word.isspace()]
    pieces = tokens(rest)
    ends = list(accumulate(len(piece) for piece in pieces))
    words = [(end, word) for end, word in zip(ends, pieces, strict=True) if not word.isspace()]
    if not said or not words or words[0][1] not in said:
        return rest
    at = said.index(words[0][1])
    shared = 0
    while shared < len(words) and at + shared < len(said) and words[shared][1] == said[at + shared]:
        shared += 1
    cut = words[shared - 1][0]
    if at + shared == len(said):  # the prompt's end is all shared: the whitespace it ends with too
        trailing = dropped[len(dropped.rstrip()) :]
        cut += len(trailing) if rest[cut:].startswith(trailing) else 0
    return rest[cut:]


def _with_next_opening(fmt: ChatFormat, chat: list[dict], index: int, ids: list[int], end: int, **kwargs):
    """The turn's ids through the stop that opens the message after reply ``index`` (a template that closes a reply
    with the next role's marker): where the render with that message follows the reply's text with a stop marker."""
    reply = fmt.tokenizer.decode(ids[:end])
    if index + 1 < len(chat):
        following = fmt.render(chat[: index + 2], **kwargs)
        texts = {text: token for token, (_, text) in fmt.stop_ids.items()}
        # the reply's last characters, first found followed by a stop where the render stops agreeing with the
        # turn's (a template may drop earlier reasoning once a message follows)
        last = reply[-12:]
        agree = next((k for k, (a, b) in enumerate(zip(reply, following, strict=False)) if a != b), len(reply))
        at = following.find(last, max(0, agree - len(last)))
        while at >= 0:
            tail = following[at + len(last) :]
            opening = next((text for text in texts if tail.startswith(text)), None)
            if opening is not None:
                return [*ids[:end], texts[opening]], end + 1
            at = following.find(last, at + 1)
    raise UnsampleableError(f"reply {index}: no stop id of the tokenizer ends the turn")


def end_markers(fmt: ChatFormat) -> tuple[str, ...]:
    """The markers a template ends a reply with, read off its own renders (never a family's list): the end texts
    of the reply format derived from it (``<|im_end|>``, ``</longcat_s>``, Gemma 4's ``<turn|>``), the marker a call
    or a content reply closes with (gpt-oss' ``<|call|>``), and where a reply closes with none, the marker the
    template writes after it once a message follows (GLM's ``<|observation|>`` and ``<|user|>``, which its
    checkpoints stop on; Apertus' ``<|assistant_end|>``)."""
    found: list[str] = []
    result = {"role": "tool", "tool_call_id": PROBES[0].message["tool_calls"][0]["id"], "content": "sunny"}
    for probe, following in ((PROBES[0], result), (PROBES[2], {"role": "user", "content": "Next."})):
        rendered = render_rest(fmt, probe)
        if rendered is None or not rendered[1].split():
            continue
        closing = marker_pieces(rendered[1].split()[-1])[-1]
        name = re.sub(r"[</|>]", "", closing)
        pair = [m for m in re.findall(r"<[^<>\s]+>", rendered[1]) if m != closing and re.sub(r"[</|>]", "", m) == name]
        if is_marker(closing) and not pair:  # a marker, not an element's close (</tool_call>)
            found.append(closing)
            continue
        try:
            alone = fmt.render([USER, probe.message], tools=TOOLS).rstrip()
            followed = fmt.render([USER, probe.message, following], tools=TOOLS)
        except TurnkitError:
            continue
        # where the reply's render ends in the longer one (a template may drop earlier reasoning once one follows)
        at = followed.rfind(alone[-12:])
        marker = first_marker(followed[at + len(alone[-12:]) :]) if at >= 0 else None
        found += [marker] if marker is not None and is_marker(marker) else []
    return tuple(dict.fromkeys(found or fmt.reply_format.end_texts))

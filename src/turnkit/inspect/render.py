"""The HTML of an inspect page: one self-contained file (inline CSS and script, no network), small, and escaped.

Every token is a ``<span>`` chip with ``data-token-id``, ``data-origin`` (``template``, ``data``, ``control``;
``text`` for shard rows, which carry no attribution), ``data-trained`` (``1``/``0``) and ``data-message`` (the
message index, ``-1`` for none), so tests and other tools can read the page. A chip's label is its id when trained and
-100 otherwise; ``data-label`` is written only for a row whose label says something else. Messages are ``<section>``
blocks with headings and counts; a newline token ends its line, as in the text.

Token text, roles and file names are untrusted: everything goes through :func:`html.escape`, and the script sets text
with ``textContent`` only. The chips are static HTML, so the page reads without the script; the script adds the
details on hover and keyboard focus (and arrow keys between tokens).
"""

from __future__ import annotations

import json
from functools import cache
from html import escape
from importlib import resources

from turnkit.inspect.page import Chip, Example, Page, TurnComparison
from turnkit.inspect.tokens import CONTINUATION, STAND_INS, Piece, Segment, partial_bytes

__all__ = ["asset", "chip_html", "render_html", "stand_ins_attribute"]


@cache
def asset(name: str) -> str:
    """A file of this package's ``assets`` folder (CSS and script shared with the server's playground)."""
    return (resources.files("turnkit.inspect") / "assets" / name).read_text(encoding="utf-8")


def stand_ins_attribute() -> str:
    """The ``data-stand-ins`` attribute a page's ``<body>`` carries: how the script gives back a token's exact text."""
    return f'data-stand-ins="{escape(json.dumps(STAND_INS, ensure_ascii=False))}"'


def _text(segments: list[Segment] | tuple[Segment, ...]) -> str:
    out = []
    for kind, text in segments:
        if kind == "v":
            out.append(f"<b>{escape(text)}</b>")
        elif kind == "char":
            out.append(f"<i class=char>{escape(text)}</i>")
        elif kind == "cont":
            out.append(f"<i class=cont>{CONTINUATION}</i>")
        else:
            out.append(escape(text))
    return "".join(out)


def chip_html(chip: Chip, *, tab_stop: bool = False) -> str:
    """One token chip (a line break follows a token that holds a newline)."""
    piece = chip.piece
    # Unquoted values (numbers and fixed words, valid HTML) keep a 2,000-token page small.
    attributes = (
        f"data-token-id={piece.id} data-origin={chip.origin} data-trained={int(chip.trained)} "
        f"data-message={chip.message}"
    )
    if chip.label != (piece.id if chip.trained else -100):
        attributes += f" data-label={chip.label}"
    if chip.forged:
        attributes += " data-forged=1"
    segments = chip.segments or tuple(piece.segments())
    if partial_bytes(segments):  # a part of a character: its bytes, and the character, on hover
        chars = "".join(text for kind, text in segments if kind in ("char", "cont"))
        attributes += f' data-bytes="{piece.raw.hex(" ")}" data-chars="{escape(chars)}"'
    if tab_stop:
        attributes += " tabindex=0"
    return f"<span {attributes}>{_text(segments)}</span>" + ("<br>\n" if piece.newline else "")


def _plain_chips(texts: list[str], mark: int) -> str:
    """Token texts without ids (``diff_prompts`` reports text): the one at ``mark`` highlighted."""
    out = []
    for n, text in enumerate(texts):
        shown = Piece(-1, text.encode(), text, False, False)
        cls = "chip diff" if n == mark else "chip"
        out.append(f'<span class="{cls}">{_text(shown.segments())}</span>')
    return "".join(out)


def _example(example: Example, number: int) -> str:
    head = f"ex{number}"
    parts = [
        f'<section class="example" aria-labelledby="{head}-h">',
        f'<h2 id="{head}-h">{escape(example.title)}</h2>',
        f'<p class="counts">{example.tokens} tokens · {example.trained} trained</p>',
    ]
    if example.note:
        parts.append(f'<p class="note">{escape(example.note)}</p>')
    for n, block in enumerate(example.blocks):
        if block.message >= 0:
            name = f"message {block.message}" + (f" · {block.role}" if block.role else "")
        else:
            name = "outside any message: template text, tool schemas, generation prompt"
            if all(chip.origin in ("text", "control") for chip in block.chips):
                name = "tokens"
        parts.append(
            f'<section class="msg" data-message="{block.message}" data-role="{escape(block.role)}" '
            f'aria-labelledby="{head}-b{n}">'
            f'<div class="msg-head"><h3 id="{head}-b{n}">{escape(name)}</h3>'
            f'<p class="counts">{block.tokens} tokens · {block.trained} trained</p></div>'
            f'<div class="toks" role="group" aria-label="{escape(name)}: tokens">'
        )
        parts.extend(chip_html(chip, tab_stop=i == 0) for i, chip in enumerate(block.chips))
        parts.append("</div></section>")
    parts.append("</section>")
    return "\n".join(parts)


def _forged(page: Page) -> str:
    items = []
    for example in page.examples:
        chips = example.chips
        for marker in example.forged:
            first = chips[marker.start]
            where = f"message {first.message}" if first.message >= 0 else "outside any message"
            role = next((b.role for b in example.blocks if b.message == first.message and b.role), "")
            origins = sorted({chip.origin for chip in chips[marker.start : marker.end]})
            items.append(
                f"<li>{escape(example.title)}, {escape(where)}{escape(f' ({role})' if role else '')}: "
                f"<code>{escape(marker.marker)}</code> stands as {marker.end - marker.start} "
                f"{'/'.join(origins)} tokens (positions {marker.start}–{marker.end - 1}), not as control token "
                f"{marker.control_id}. The model reads it as text.</li>"
            )
    if not items:
        return ""
    return (
        '<section aria-labelledby="forged-h"><h2 id="forged-h">Marker text in data, neutralised</h2>'
        "<p>Control-token text found in data was encoded as plain text; its tokens are outlined.</p>"
        f"<ul>{''.join(items)}</ul></section>"
    )


def _verdict(value: bool | None, yes: str, no: str) -> str:
    if value is None:
        return "<td>no prompt before it</td>"
    return f'<td class="ok">✓ {yes}</td>' if value else f'<td class="bad">✗ {no}</td>'


def _excerpt(text: str, at: int) -> str:
    return f'<pre class="excerpt">{escape(text[:at])}<mark>{escape(text[at:])}</mark></pre>'


def _comparison_details(turn: TurnComparison) -> str:
    parts = []
    if turn.prompt_prefix is False:
        parts.append(
            f'<div class="diff-rows"><h3>message {turn.message}: first different token at position '
            f"{turn.position}</h3>"
            f'<p>serving prompt</p><div class="toks">{_plain_chips(turn.serving, turn.token_at)}</div>'
            f'<p>training example</p><div class="toks">{_plain_chips(turn.training, turn.token_at)}</div></div>'
        )
    if turn.excerpt_of:
        what = "the serving prompt" if turn.excerpt_of == "prompt" else "the turn as the model generated it"
        at = turn.excerpt_at
        expected, render = turn.expected_excerpt, turn.render_excerpt
        parts.append(
            f'<div class="diff-rows"><h3>message {turn.message}: {what} leaves the training text</h3>'
            f"<p>{escape(what)}</p>{_excerpt(expected, at)}<p>training text</p>{_excerpt(render, at)}</div>"
        )
    return "".join(parts)


def _comparisons(page: Page) -> str:
    if not page.comparisons:
        return ""
    rows = []
    for turn in page.comparisons:
        rows.append(
            f'<tr><th scope="row">message {turn.message}</th>'
            + _verdict(turn.prompt_prefix, "same tokens", f"differs at token {turn.position}")
            + _verdict(turn.generated_prefix, "same text", "differs")
            + "</tr>"
        )
    details = "".join(_comparison_details(turn) for turn in page.comparisons)
    return (
        '<section aria-labelledby="serve-h"><h2 id="serve-h">Train vs serve</h2>'
        "<p>For each assistant turn: is the prompt the server builds (history and generation prompt) the start of the "
        "training example, token by token, and is the turn as the model generated it the start of the training text?"
        "</p>"
        '<div class="table-wrap"><table><caption class="counts">assistant turns</caption><thead><tr>'
        '<th scope="col">turn</th><th scope="col">serving prompt vs training tokens</th>'
        '<th scope="col">generated turn vs training text</th></tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>{details}</section>"
    )


def _summary(page: Page) -> str:
    origins = page.origin_counts()
    items = [("tokens", page.tokens), ("trained", page.trained), ("examples", len(page.examples))]
    items += [(f"{kind} tokens", origins[kind]) for kind in ("template", "data", "control", "text") if origins[kind]]
    items.append(("forged markers", page.forged))
    cells = "".join(f"<div><dt>{escape(name)}</dt><dd>{value:,}</dd></div>" for name, value in items)
    controls = ", ".join(
        f"<code>{escape(text)}</code> id {token_id} ×{n}" for text, token_id, n in page.control_counts()
    )
    notes = "".join(f'<p class="note">{escape(note)}</p>' for note in page.notes)
    return (
        f'<section aria-labelledby="summary-h"><h2 id="summary-h">Summary</h2><dl class="summary">{cells}</dl>'
        f"<p>Control ids: {controls or 'none'}</p>{notes}</section>"
    )


def _legend_chip(text: str, origin: str, trained: int = 0, forged: bool = False) -> str:
    extra = ' data-forged="1"' if forged else ""
    return f'<span class="chip" data-origin="{origin}" data-trained="{trained}"{extra}>{text}</span>'


_LEGEND = (
    '<ul class="legend">'
    f"<li>{_legend_chip('tmpl', 'template')} template text</li>"
    f"<li>{_legend_chip('data', 'data')} message data</li>"
    f"<li>{_legend_chip('&lt;|c|&gt;', 'control')} control token</li>"
    f"<li>{_legend_chip('ok', 'data', 1)} trained (bar)</li>"
    f"<li>{_legend_chip('&lt;|', 'data', forged=True)} marker text from data</li>"
    "<li><code><b>·</b></code> space, <code><b>→</b></code> tab, <code><b>↵</b></code> newline</li></ul>"
)


def render_html(page: Page) -> str:
    """The page as one HTML document."""
    legend = _LEGEND
    if page.origin_counts()["text"]:
        text = f"<li>{_legend_chip('text', 'text')} text (shards do not record template or data)</li>"
        legend = legend.replace('<ul class="legend">', f'<ul class="legend">{text}')
    body = [
        f'<header><h1>{escape(page.title)}</h1><p class="source">{escape(page.source)}</p></header>',
        "<main>",
        _summary(page),
        '<section aria-labelledby="legend-h"><h2 id="legend-h">Legend</h2>',
        legend,
        "<p>Hover a token, or tab to a message's tokens and use the arrow keys, to see its id, text, message, role "
        "and label.</p></section>",
        _forged(page),
        _comparisons(page),
        *(_example(example, n) for n, example in enumerate(page.examples)),
        "</main>",
        '<output id="details" class="details" aria-live="polite">token details appear here</output>',
        "<footer><p>Made by turnkit inspect. Self-contained: no network.</p></footer>",
        f"<script>{asset('chips.js')}</script>",
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{escape(page.title)}</title>\n"
        '<link rel="icon" href="data:,">\n'
        f"<style>{asset('chips.css')}{asset('inspect.css')}</style>\n</head>\n"
        f"<body {stand_ins_attribute()}>\n" + "\n".join(part for part in body if part) + "\n</body>\n</html>\n"
    )

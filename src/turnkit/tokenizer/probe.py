"""The differential self-check the fast tokenizer path must pass at load: the same ids, the same character positions.

:mod:`.fast` decides from the tokenizer's definition that tiktoken's BPE gives the ``tokenizers`` ids; this check
guards the parts that are not decided there (the regex engine, offsets) and any mistake in the decision, on a text
that touches every class the pre-tokenizer patterns tell apart: letters of many scripts, combining marks, digits
runs, whitespace runs of every kind, contractions, punctuation, emoji sequences, right-to-left text, chat markup.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PROBE_TEXTS", "self_check"]

PROBE_TEXTS: tuple[str, ...] = (
    "Hello, world! It's a test: we'll see what they've got, I'm sure you'd agree. DON'T SHOUT'S",
    "def f(x):\n    return x ** 2  # squares\n\n\n\tindented\r\n  trailing   \n",
    "digits 0 12 345 6789 1234567890 3.14159 -42 1e10 ٣٤٥ ௧௨ ½ ²",
    "   leading spaces, double  spaces,   triple, tabs\t\tand\u00a0nbsp\u2003em space\u3000ideographic   ",
    "Ünïcödé café naïve résumé e\u0301 a\u0308 \u0915\u093f\u0928\u094d\u0926\u0940 Zalgo: Z\u0351\u0352\u0353",
    "中文测试，全角标点！日本語のテキスト。한국어 텍스트입니다. ภาษาไทย",
    "emoji 😀 👍🏽 👨\u200d👩\u200d👧\u200d👦 🏳\ufe0f\u200d🌈 🇫🇷 ❤\ufe0f keycap 1\ufe0f\u20e3",
    "RTL: \u0645\u0631\u062d\u0628\u0627 \u05e9\u05dc\u05d5\u05dd \u202bembedded\u202c \u200f mark",
    '<|im_start|>user\n{"name": "get_weather", "arguments": {"city": "Paris"}}<|im_end|>\n<tool_call></s>[INST]',
    "symbols ~!@#$%^&*()_+-=[]{}|;':\",./<>? `backticks` «quotes» “curly” — dash … ellipsis",
    "\n\n\n   \n\t \n x \n\n",
    "a" * 300 + " " + "ab" * 150 + " " + "9" * 64 + " " * 40 + "end",
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟙𝟚𝟛 \U0001f9d1\U0001f3fb\u200d\U0001f4bb \U00020000\U0002a6d6 ꙮ ᚠᛇᚻ",
)


def self_check(fast: Any, reference: Any, texts: tuple[str, ...] = PROBE_TEXTS) -> str | None:
    """None when ``fast`` encodes every probe text as ``reference`` does (ids and ``char_to_token`` at every
    position); else what differs first."""
    for text in texts:
        mine, theirs = fast.encode(text), reference.encode(text, add_special_tokens=False)
        if list(mine.ids) != list(theirs.ids):
            return f"ids differ on {text[:40]!r}"
        for position in range(len(text)):
            if mine.char_to_token(position) != theirs.char_to_token(position):
                return f"character {position} of {text[:40]!r} maps to another token"
    return None

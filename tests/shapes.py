"""Training data of the shapes real datasets have, generated from a seed, with the models that prepare it.

Read by ``tests/data/test_prepare_shapes.py`` (prepare's output pinned over every shape) and ``benchmarks/prepare.py``
(prepare against ``datasets.map`` on every shape). Each :class:`Shape` says how its records look, which template
turnkit prepares them with (the shape's own: with or without ``{% generation %}`` tags) and which template the
``datasets.map`` baseline uses (transformers makes assistant masks only from ``{% generation %}`` tags, so the baseline
gets a tagged template that renders the same text).

The records are a function of the seed alone (``random.Random``), so a test can pin what prepare writes for them.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SYSTEMS = [
    "You are a helpful assistant. Answer briefly and precisely, and say when you do not know.",
    "You are a support agent for an airline. Be polite, check booking details, never invent flight numbers.",
    "You are a coding assistant. Prefer Python, explain your reasoning, and include short examples.",
    "You are a travel planner. Suggest itineraries with times, budgets and alternatives for bad weather.",
    "You are a tutor for high-school mathematics. Guide the student step by step without giving away answers.",
]
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city.",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "search_flights", "description": "Flights between two airports.",
     "parameters": {"type": "object", "properties": {"from": {"type": "string"}, "to": {"type": "string"},
                                                      "date": {"type": "string"}}, "required": ["from", "to"]}}},
]  # fmt: skip
#: The words of the earlier benchmark's conversations (the ``mixed`` shape), and more, with punctuation and digits.
EARLIER_WORDS = (
    "please could you explain how the weather in paris affects flights to london tomorrow morning and what "
    "options exist for a family of four with two children and a dog travelling on a budget in the spring"
).split()
WORDS = (
    EARLIER_WORDS + "given that the train is often late, also list 3 cheaper routes (with prices) if possible;".split()
)
#: Sprinkled into English text: accents, CJK and emoji, as real chat data has them.
ACCENTS = ["café", "naïve", "résumé", "über", "São", "Zürich", "señor", "déjà", "fiancée", "Ørsted"]
CJK_AND_EMOJI = ["東京", "天気", "ありがとう", "北京", "你好", "서울", "😀", "🚀", "👍🏽", "🇫🇷"]
#: Text that is mostly not ASCII: Chinese, Japanese, Korean, Russian, Arabic, Greek, emoji.
UNICODE_WORDS = [
    "今天", "天气", "很好", "我们", "去", "公园", "散步", "東京", "の", "天気", "は", "晴れ", "です", "ありがとう",
    "ございます", "서울", "날씨", "좋아요", "Москва", "погода", "хорошая", "спасибо", "القاهرة", "الطقس", "جميل",
    "Αθήνα", "καιρός", "😀", "🚀", "👍🏽", "🇯🇵", "❤️", "café", "naïve", "Zürich",
]  # fmt: skip


def words(rng: random.Random, low: int, high: int, pool: list[str] = WORDS, sprinkle: float = 0.0) -> str:
    """A sentence of ``low`` to ``high`` words from ``pool``; ``sprinkle``: the share of accented, CJK, emoji words."""
    out = []
    for _ in range(rng.randint(low, high)):
        if sprinkle and rng.random() < sprinkle:
            out.append(rng.choice(ACCENTS if rng.random() < 0.5 else CJK_AND_EMOJI))
        else:
            out.append(rng.choice(pool))
    return " ".join(out).capitalize() + "."


def _exchanges(rng: random.Random, low: int, high: int, length: tuple[int, int], sprinkle: float) -> list[dict]:
    messages = []
    for _ in range(rng.randint(low, high)):
        messages.append({"role": "user", "content": words(rng, *length, sprinkle=sprinkle)})
        messages.append({"role": "assistant", "content": words(rng, *length, sprinkle=sprinkle)})
    return messages


def single_turn(rng: random.Random) -> dict:
    system = [{"role": "system", "content": rng.choice(SYSTEMS)}] if rng.random() < 0.5 else []
    return {"messages": system + _exchanges(rng, 1, 1, (8, 60), 0.03)}


def multi_turn(rng: random.Random) -> dict:
    """The shape of the issue that asked for this benchmark: 1-3 exchanges of 20-120 words, some unicode."""
    return {"messages": [{"role": "system", "content": rng.choice(SYSTEMS)}, *_exchanges(rng, 1, 3, (20, 120), 0.05)]}


def long_multi_turn(rng: random.Random) -> dict:
    return {"messages": [{"role": "system", "content": rng.choice(SYSTEMS)}, *_exchanges(rng, 6, 10, (10, 60), 0.03)]}


_LONG_SYSTEMS = [words(random.Random(n), 300, 900) for n in range(8)]


def long_system(rng: random.Random) -> dict:
    """A few long system prompts (300-900 words: instructions, policies, a persona), shared across records."""
    system = {"role": "system", "content": rng.choice(_LONG_SYSTEMS)}
    return {"messages": [system, *_exchanges(rng, 1, 2, (10, 60), 0.02)]}


def tool_calls(rng: random.Random) -> dict:
    """Every record offers tools; most call one or two, each followed by its result and an answer."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": rng.choice(SYSTEMS)}]
    for _ in range(rng.randint(1, 2)):
        messages.append({"role": "user", "content": words(rng, 10, 40)})
        if rng.random() < 0.8:
            cities = rng.sample(["Paris", "London", "Oslo", "Rome", "Zürich"], rng.randint(1, 2))
            calls = [
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": city}}}
                for city in cities
            ]
            messages.append({"role": "assistant", "content": "", "tool_calls": calls})
            for city in cities:
                result = {"city": city, "temp_c": rng.randint(-5, 30), "sky": rng.choice(["clear", "rain", "fog"])}
                messages.append({"role": "tool", "content": json.dumps(result)})
        messages.append({"role": "assistant", "content": words(rng, 20, 80)})
    return {"messages": messages, "tools": TOOLS}


def sharegpt(rng: random.Random) -> dict:
    """ShareGPT records (``conversations`` of ``from``/``value``, a ``system`` field, an ``id``)."""
    speakers = {"user": "human", "assistant": "gpt"}
    turns = [{"from": speakers[m["role"]], "value": m["content"]} for m in _exchanges(rng, 1, 3, (20, 100), 0.05)]
    return {"id": f"sg-{rng.getrandbits(40):010x}", "system": rng.choice(SYSTEMS), "conversations": turns}


def unicode_heavy(rng: random.Random) -> dict:
    messages = [{"role": "system", "content": rng.choice(SYSTEMS)}]
    for _ in range(rng.randint(1, 3)):
        messages.append({"role": "user", "content": words(rng, 10, 80, UNICODE_WORDS)})
        messages.append({"role": "assistant", "content": words(rng, 10, 80, UNICODE_WORDS)})
    return {"messages": messages}


def mixed(rng: random.Random) -> dict:
    """The earlier benchmark's data (README's first figures, and the memory figures): 2-4 exchanges of 10-80 words,
    a third with a tool call and its result, over the Qwen tool template."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": rng.choice(SYSTEMS)}]
    tools = None
    for turn in range(rng.randint(2, 4)):
        messages.append({"role": "user", "content": words(rng, 10, 40, EARLIER_WORDS)})
        if turn == 0 and rng.random() < 0.33:
            tools = TOOLS
            city = rng.choice(["Paris", "London", "Oslo", "Rome"])
            call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": city}}}
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
            messages.append({"role": "tool", "content": json.dumps({"city": city, "temp_c": rng.randint(-5, 30)})})
        messages.append({"role": "assistant", "content": words(rng, 20, 80, EARLIER_WORDS)})
    return {"messages": messages, "tools": tools}


def to_messages(record: dict) -> tuple[list[dict], list[dict] | None]:
    """A record's messages and tools, as a user converts them before ``apply_chat_template`` (ShareGPT included)."""
    if "conversations" in record:
        roles = {"human": "user", "gpt": "assistant"}
        system = [{"role": "system", "content": record["system"]}] if record.get("system") else []
        return system + [{"role": roles[t["from"]], "content": t["value"]} for t in record["conversations"]], None
    return record["messages"], record.get("tools")


# -- templates -------------------------------------------------------------------------------------------------------

#: SmolLM2's own template (the embedded model's) with {% generation %} around what each assistant turn writes.
SMOLLM2_TAGGED = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}{% if message['role'] == 'assistant' %}{{ '<|im_start|>assistant\\n' }}{% generation %}"
    "{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\\n' }}{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
QWEN_TOOL_MARKERS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]


def qwen_tagged() -> str:
    """The qwen2.5 family's template with {% generation %} around what each assistant turn writes."""
    from turnkit import families

    text = families.get("qwen2.5").template
    text = text.replace(
        "{{- '<|im_start|>assistant' -}}\n        {%- if message.content -%}",
        "{{- '<|im_start|>assistant' -}}\n        {%- generation -%}\n        {%- if message.content -%}",
    )
    text = text.replace(
        "{%- endfor -%}\n        {{- '<|im_end|>\\n' -}}",
        "{%- endfor -%}\n        {{- '<|im_end|>' -}}\n        {%- endgeneration -%}\n        {{- '\\n' -}}",
    )
    other_turn = "{{- '<|im_start|>' ~ message.role ~ '\\n' ~ text_of(message.content) ~ '<|im_end|>\\n' -}}"
    text = text.replace(
        "{%- else -%}\n        " + other_turn,
        "{%- elif message.role == 'assistant' -%}\n        {{- '<|im_start|>assistant\\n' -}}{%- generation -%}"
        "{{- text_of(message.content) ~ '<|im_end|>' -}}{%- endgeneration -%}{{- '\\n' -}}\n    {%- else -%}\n"
        "        {{- '<|im_start|>' ~ message.role ~ '\\n' ~ text_of(message.content) ~ '<|im_end|>\\n' -}}",
    )
    assert text.count("generation -%}") == 2 * 2, "the family template changed; update tests/shapes.py"
    return text


def _template(kind: str) -> str:
    from turnkit import families

    templates = {
        "smollm2-tagged": SMOLLM2_TAGGED,
        "qwen": families.get("qwen2.5").template,
        "qwen-tagged": qwen_tagged(),
    }
    return templates[kind]


def model_folder(kind: str, tokenizer_folder: Path, out: Path) -> Path:
    """A model folder for prepare: the SmolLM2 tokenizer (``tokenizer_folder``) with the template ``kind``:
    ``smollm2`` (its own, untagged), ``smollm2-tagged``, ``qwen`` (the qwen2.5 family's, with Qwen's tool markers
    added to the tokenizer) or ``qwen-tagged``."""
    import shutil

    folder = out / kind
    if folder.is_dir():
        return folder
    if kind == "smollm2":
        shutil.copytree(tokenizer_folder, folder)
        return folder
    from corpus import tokenizer_with_markers

    tokenizer = tokenizer_with_markers(tokenizer_folder, QWEN_TOOL_MARKERS if kind.startswith("qwen") else [])
    tokenizer.chat_template = _template(kind)
    tokenizer.save_pretrained(folder)
    (folder / "chat_template.jinja").write_text(_template(kind))
    return folder


# -- the shapes ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """One kind of training data: how a record looks, the template prepare uses, the baseline's tagged template."""

    name: str
    record: Callable[[random.Random], dict]
    model: str  # model_folder kind for turnkit
    baseline: str  # model_folder kind for datasets.map + apply_chat_template (always tagged)

    def records(self, count: int, seed: int) -> list[dict]:
        rng = random.Random(f"{self.name}:{seed}")
        return [self.record(rng) for _ in range(count)]


SHAPES = [
    Shape("single-turn", single_turn, "smollm2", "smollm2-tagged"),
    Shape("multi-turn 1-3", multi_turn, "smollm2", "smollm2-tagged"),
    Shape("multi-turn 6-10", long_multi_turn, "smollm2", "smollm2-tagged"),
    Shape("long system prompts", long_system, "smollm2", "smollm2-tagged"),
    Shape("tool calls", tool_calls, "qwen", "qwen-tagged"),
    Shape("sharegpt", sharegpt, "smollm2", "smollm2-tagged"),
    Shape("unicode-heavy", unicode_heavy, "smollm2", "smollm2-tagged"),
    Shape("generation tags", multi_turn, "smollm2-tagged", "smollm2-tagged"),
    Shape("tool calls, generation tags", tool_calls, "qwen-tagged", "qwen-tagged"),
    Shape("mixed (earlier benchmark)", mixed, "qwen-tagged", "qwen-tagged"),
]

"""Conversations for differential tests: the shapes real traffic has, and the edge cases that break renderers."""

from __future__ import annotations

import copy
from typing import Any

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city, e.g. Paris"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Get the local time of a timezone.",
        "parameters": {
            "type": "object",
            "properties": {"timezone": {"type": "string", "description": "IANA name, e.g. Europe/Paris"}},
            "required": ["timezone"],
        },
    },
}


def _call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


#: (name, messages, tools) triples.
CONVERSATIONS: list[tuple[str, list[dict[str, Any]], list[dict[str, Any]] | None]] = [
    ("single-user", [{"role": "user", "content": "What is the capital of Portugal?"}], None),
    (
        "system-user",
        [
            {"role": "system", "content": "You are a terse assistant."},
            {"role": "user", "content": "Name a prime number."},
        ],
        None,
    ),
    (
        "multi-turn",
        [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": "Hi there! How can I help?"},
            {"role": "user", "content": "Tell me a joke."},
            {"role": "assistant", "content": "Why did the chicken cross the road? To get to the other side."},
            {"role": "user", "content": "Another one"},
        ],
        None,
    ),
    (
        "no-system-multi-turn",
        [
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4"},
            {"role": "user", "content": "And 3+3?"},
        ],
        None,
    ),
    (
        "whitespace-padded",
        [
            {"role": "system", "content": "  Be brief.  \n"},
            {"role": "user", "content": "\n\n  spaced out question \t "},
            {"role": "assistant", "content": "   I am an assistant   "},
            {"role": "user", "content": " next "},
        ],
        None,
    ),
    (
        "unicode",
        [
            {"role": "user", "content": "Übersetze: 你好，世界 🌍 — «ça va?» مرحبا e\u0301"},
            {"role": "assistant", "content": "Hallo Welt 👋 (\u200b zero width)"},
            {"role": "user", "content": "日本語で？"},
        ],
        None,
    ),
    (
        "empty-content",
        [
            {"role": "system", "content": ""},
            {"role": "user", "content": ""},
            {"role": "assistant", "content": ""},
            {"role": "user", "content": "ok"},
        ],
        None,
    ),
    (
        "assistant-last",
        [
            {"role": "user", "content": "Say hi."},
            {"role": "assistant", "content": "Hi!"},
        ],
        None,
    ),
    (
        "tool-call-and-result",
        [
            {"role": "system", "content": "You can call tools."},
            {"role": "user", "content": "What's the weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [_call("call_1", "get_weather", {"city": "Paris"})]},
            {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": '{"temp_c": 21}'},
            {"role": "assistant", "content": "It is 21 °C in Paris."},
            {"role": "user", "content": "Thanks!"},
        ],
        [WEATHER_TOOL],
    ),
    (
        "parallel-tool-calls",
        [
            {"role": "user", "content": "Weather and time in Tokyo?"},
            {
                "role": "assistant",
                "content": "Let me check both.",
                "tool_calls": [
                    _call("call_a", "get_weather", {"city": "Tokyo", "unit": "celsius"}),
                    _call("call_b", "get_time", {"timezone": "Asia/Tokyo"}),
                ],
            },
            {"role": "tool", "tool_call_id": "call_a", "name": "get_weather", "content": '{"temp_c": 18}'},
            {"role": "tool", "tool_call_id": "call_b", "name": "get_time", "content": '{"time": "09:30"}'},
        ],
        [WEATHER_TOOL, TIME_TOOL],
    ),
    (
        "tools-offered-no-call",
        [
            {"role": "system", "content": "Use tools when needed."},
            {"role": "user", "content": "Hi, who are you?"},
        ],
        [WEATHER_TOOL, TIME_TOOL],
    ),
    (
        "reasoning",
        [
            {"role": "user", "content": "Is 91 prime?"},
            {
                "role": "assistant",
                "reasoning_content": "91 = 7 * 13, so it is not prime.",
                "content": "No, 91 = 7 × 13.",
            },
            {"role": "user", "content": "And 97?"},
        ],
        None,
    ),
    (
        "content-parts",
        [
            {"role": "system", "content": [{"type": "text", "text": "Answer in French."}]},
            {"role": "user", "content": [{"type": "text", "text": "Good morning!"}]},
        ],
        None,
    ),
]


def conversations() -> list[tuple[str, list[dict[str, Any]], list[dict[str, Any]] | None]]:
    """Fresh copies, so that no test can leak a mutation into another."""
    return copy.deepcopy(CONVERSATIONS)

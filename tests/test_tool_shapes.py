"""Tool calls outside the ``<tool_call>`` tags (issue 43): an answer that is wholly a ```json block or a bare JSON
value naming declared tools is calls; anything else stays content, and every split of the stream gives what the
whole text gives, with nothing of a call shown as content first."""

from __future__ import annotations

import json

import pytest

from edgespec.apps.tools import ToolCallParser, whole_calls

NAMES = ("get_weather", "get_time")
QWEN = '```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Paris"\n  }\n}\n```'  # the 1.5B's answer
PARIS = ("get_weather", {"city": "Paris"})

CALLS = {  # text -> the calls it is
    QWEN: [PARIS],
    '\n ```JSON\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```\n': [PARIS],
    '```\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```': [PARIS],
    '{"name": "get_weather", "arguments": {"city": "Paris"}}': [PARIS],
    '{"arguments": "{\\"city\\": \\"Paris\\"}", "name": "get_weather"}': [PARIS],
    '{"name": "get_weather", "parameters": {"city": "Paris"}}': [PARIS],
    '{"name": "get_\\u0077eather", "arguments": {"city": "Paris"}}': [PARIS],
    '```json\n[{"name": "get_weather", "arguments": {"city": "Paris"}},\n'
    ' {"name": "get_time", "arguments": {"zone": "CET"}}]\n```': [PARIS, ("get_time", {"zone": "CET"})],
}
CONTENT = [  # text that stays content, whole
    '{"name": "get_news", "arguments": {"city": "Paris"}}',  # not a declared tool
    '```json\n{"name": "get_weathers", "arguments": {}}\n```',
    'Here you go:\n```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```',  # prose before
    '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```\nThat asks for the weather.',  # after
    '{"name": "get_weather", "arguments": {"city": "Paris"}} and more',
    '{"name": "get_weather", "city": "Paris"}',  # a key a call does not have
    '{"name": "get_weather", "arguments": {}, "parameters": {}}',
    '{"name": "get_news", "name": "get_weather", "arguments": {}}',  # a repeated key
    '[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "rm", "arguments": {}}]',
    '{"city": "Paris", "sky": "clear"}',
    '```python\nprint({"name": "get_weather", "arguments": {}})\n```',
    '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}',  # the fence never closes
    '{"name": "get_weather", "arguments": {"city": "Paris"}',  # nor the object
    "[]", "{}", "```", "[1] is a citation.", "{name} is a placeholder.", "Paris: sunny, 21 °C.", "  \n",
]


def _events(pieces, names=NAMES):
    p = ToolCallParser(names)
    out = []
    for piece in pieces:
        out.append(p.push(piece))
    out.append(p.flush())
    return out


def _joined(steps):
    ev = [e for step in steps for e in step]
    return ("".join(v for k, v in ev if k == "content"),
            [(v.name, json.loads(v.arguments)) for k, v in ev if k == "call"])


@pytest.mark.parametrize("text", list(CALLS))
def test_an_answer_that_is_wholly_calls_is_calls_at_every_split(text):
    assert [(c.name, json.loads(c.arguments)) for c in whole_calls(text, NAMES)] == CALLS[text]
    assert _joined(_events([text])) == ("", CALLS[text])
    for cut in range(len(text) + 1):
        assert _joined(_events([text[:cut], text[cut:]])) == ("", CALLS[text]), cut
    steps = _events(list(text))
    assert not any(steps[:-1]) and _joined(steps) == ("", CALLS[text])  # nothing shown before the end


@pytest.mark.parametrize("text", CONTENT)
def test_other_answers_stay_content_at_every_split(text):
    assert whole_calls(text, NAMES) is None
    whole = _joined(_events([text]))
    assert whole == (text, [])
    for cut in range(len(text) + 1):
        assert _joined(_events([text[:cut], text[cut:]])) == whole, cut
    assert _joined(_events(list(text))) == whole


@pytest.mark.parametrize("text, shown", [
    ("Paris: sunny.", "P"),  # plain prose streams at once
    ('{"city": "Paris", "sky": "clear"}', '{"c'),  # a first key no call has
    ('{"name": "get_news", "arguments": {}}', '{"name": "get_n'),  # a name no declared tool has
    ("```python\nx = 1\n```", "```p"),
    ('{"name": "get_weather", "arguments": {}} and more', '{"name": "get_weather", "arguments": {}} a'),
])
def test_content_is_released_as_soon_as_it_cannot_be_a_call(text, shown):
    p = ToolCallParser(NAMES)
    first = None
    for i in range(1, len(text) + 1):
        if p.push(text[i - 1]):
            first = text[:i]
            break
    assert first == shown


def test_tags_still_parse_and_no_names_means_tags_only():
    tagged = 'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    assert _joined(_events([tagged])) == ("Sure.", [PARIS])
    assert _joined(_events([QWEN], names=())) == (QWEN, [])  # response_format set, or no tools declared

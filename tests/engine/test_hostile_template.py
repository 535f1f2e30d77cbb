"""Hostile chat templates: a render that spins stops at its time limit (in any thread), one that
builds a huge value stops before it is built, whatever operator or filter it uses; the sandbox
keeps refusing Python internals; and long conversations are located reply by reply in windows,
with the same spans as in the whole conversation."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

import engine.text.chat_template as chat_template
from engine.errors import TemplateError
from engine.text.chat_template import CHATML_TEMPLATE, ChatTemplate

pytestmark = pytest.mark.timeout(60)

MESSAGES = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
TEMPLATE_DIR = Path(__file__).resolve().parents[1] / "data" / "templates"
EXPECTED = json.loads((TEMPLATE_DIR / "expected.json").read_text(encoding="utf-8"))


def _render(source: str, messages=MESSAGES, seconds: float = 0.3) -> str:
    """The TemplateError message of rendering `source`; asserts it came in time and left `messages` as
    they were."""
    before = json.dumps(messages)
    start = time.monotonic()
    with pytest.raises(TemplateError) as err:
        ChatTemplate(source, time_limit=seconds).render(messages)
    assert time.monotonic() - start < seconds + 2.0
    assert json.dumps(messages) == before
    assert "\n" not in str(err.value)
    return str(err.value)


# -- time -------------------------------------------------------------------------------------------

SPINNING = [
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{% for i in range(100000) %}{% for j in range(100000) %}{{ '' }}{% endfor %}{% endfor %}",
    "{% for i in range(100000) %}{% for j in range(100000) %}{% set x = i + j %}{% endfor %}{% endfor %}",
    "{% for i in range(100000) %}{% for m in messages * 1000 %}{{ m.role|length }}{% endfor %}{% endfor %}",
    "{% macro f(n) %}{% for i in range(100000) %}{% endfor %}{{ f(n) if n else '' }}{% endmacro %}"
    "{% for i in range(100000) %}{{ f(0) }}{% endfor %}",
    "{% for i in range(100000) %}{{ range(100000)|map('string')|list|length }}{% endfor %}",
]


@pytest.mark.parametrize("source", SPINNING)
def test_spinning_templates_stop_at_the_time_limit(source):
    message = _render(source)
    assert "was stopped on line 1: rendering took longer than the time limit of 0.3 s" in message


def test_the_time_limit_works_in_a_worker_thread_and_leaves_no_thread_behind():
    threads = threading.active_count()
    outcome: list[BaseException | str] = []

    def work() -> None:
        try:
            outcome.append(ChatTemplate(SPINNING[0], time_limit=0.2).render(MESSAGES))
        except BaseException as exc:  # noqa: BLE001 - what the thread saw is the test's result
            outcome.append(exc)

    worker = threading.Thread(target=work)
    start = time.monotonic()
    worker.start()
    worker.join(10)
    assert not worker.is_alive() and time.monotonic() - start < 3
    assert isinstance(outcome[0], TemplateError) and "time limit of 0.2 s" in str(outcome[0])
    assert threading.active_count() == threads


def test_render_with_spans_shares_one_time_limit():
    source = (
        "{% for i in range(100000) %}{% for j in range(30) %}{% endfor %}{% endfor %}{{ messages|length }}"
    )
    template = ChatTemplate(source, time_limit=0.5)
    start = time.monotonic()
    with pytest.raises(TemplateError, match="time limit"):
        template.render_with_spans(MESSAGES * 20)  # 20 replies: many renders, one deadline
    assert time.monotonic() - start < 3


def test_the_time_limit_is_checked():
    for bad in (0, -1, float("nan"), float("inf"), "5"):
        with pytest.raises(TemplateError, match="time_limit must be a positive number of seconds"):
            ChatTemplate("x", time_limit=bad)


# -- size -------------------------------------------------------------------------------------------


def doubling(seed: str, step: str) -> str:
    """A template that sets ns.s = `step` 80 times, from `seed`: each step at least doubles it."""
    loop = f"{{% for i in range(80) %}}{{% set ns.s = {step} %}}{{% endfor %}}"
    return f"{{% set ns = namespace(s={seed}) %}}{loop}"


HUGE = [
    # (source, what the message names)
    ("{{ 'x' * 10 ** 12 }}", "the * operator"),
    ("{{ ([0] * 10 ** 6) * 10 ** 6 }}", "the * operator"),
    ("{{ 9 ** 999999 }}", "the ** operator"),
    (doubling("3", "ns.s * ns.s"), "the * operator would make a number"),
    (doubling("'ab'", "ns.s + ns.s"), "the + operator"),
    (doubling("[1]", "ns.s + ns.s"), "the + operator"),
    (doubling("'ab'", "ns.s ~ ns.s"), "the ~ operator"),
    (doubling("'ab'", "[ns.s, ns.s]|join"), "join"),
    (doubling("'ab'", "ns.s.join(['x', 'y', 'z'])"), "join"),
    (doubling("'ab'", "ns.s|replace('a', ns.s)"), "replace"),
    (doubling("'ab'", "ns.s.replace('a', ns.s)"), "replace"),
    (doubling("'ab'", "'%s%s'|format(ns.s, ns.s)"), "format"),
    (doubling("'ab'", "'{0}{0}'.format(ns.s)"), "format"),
    (doubling("'ab'", "'%s%s' % (ns.s, ns.s)"), "the % operator"),
    (doubling("'{0}{0}'", "ns.s.format(ns.s)"), "format"),
    (doubling("'ab'", "ns.s|center(ns.s|length * 2)"), "center"),
    ("{{ '%0999999999d' % 1 }}", "the % operator"),
    ("{{ '%*d' % (10 ** 10, 1) }}", "the % operator"),
    ("{{ '%*d'|format(10 ** 10, 1) }}", "format"),
    ("{{ '{:>999999999}'.format(1) }}", "format"),
    ("{{ '{:{w}}'.format(1, w=10 ** 10) }}", "format"),
    ("{{ '{x:{w}}'.format_map({'x': 1, 'w': 10 ** 10}) }}", "format_map"),
    ("{{ 'x'|center(2 ** 40) }}", "center"),
    ("{{ 'x'.center(2 ** 40) }}", "center"),
    ("{{ 'x'.ljust(10 ** 10) }}", "ljust"),
    ("{{ 'x'.rjust(10 ** 10) }}", "rjust"),
    ("{{ 'x'.zfill(10 ** 10) }}", "zfill"),
    ("{{ 'a\\nb'|indent(10 ** 10) }}", "indent"),
    ("{{ ('\t' * 99999).expandtabs(99999) }}", "expandtabs"),
    ("{{ ('a' * 9999).translate({97: 'b' * 99999}) }}", "translate"),
    ("{{ range(99999)|join('x' * 99999) }}", "join"),
    ("{{ ('x' * 99999).join(range(99999)|map('string')) }}", "join"),
    ("{{ (1).to_bytes(10 ** 10, 'big') }}", "to_bytes"),
    ("{{ range(10)|batch(10 ** 10, 0)|list }}", "batch(10000000000) asks for more than 1,000,000 items"),
    ("{{ range(10)|slice(10 ** 10)|list }}", "slice(10000000000) asks for more than 1,000,000 items"),
    ("{{ {'a': [1]}|tojson(indent=10 ** 9) }}", "tojson indent 1000000000 is larger than 64"),
    ("{{ ([[0] * 5000] * 5000)|sum(start=[]) }}", "sum"),
    ("{{ ([[0] * 2000] * 2000)|sum(start=[]) }}", "sum"),
    ("{{ lipsum(10 ** 9) }}", "lipsum(1000000000, max=100) asks for more than 100,000 words"),
    ("{% for i in range(99999) %}{{ 'y' * 99999 }}{% endfor %}", "the output"),
    ("{% set x %}{% for i in range(99999) %}{{ 'y' * 99999 }}{% endfor %}{% endset %}", "the output"),
    (
        "{% filter upper %}{% for i in range(99999) %}{{ 'y' * 9999 }}{% endfor %}{% endfilter %}",
        "the output",
    ),
    ("{% macro f(s) %}{{ f(s ~ s) }}{% endmacro %}{{ f('x') }}", "the ~ operator"),
    ("{% for i in range(99999) %}{% set y = 'y' * 99999 ~ i %}{% endfor %}", "operator"),
    ("{{ ('x' * 200000)|striptags }}", "striptags takes at most 100,000 characters"),
    ("{{ ('x' * 200000)|wordwrap(1) }}", "wordwrap takes at most 100,000 characters"),
]


@pytest.mark.parametrize(("source", "what"), HUGE, ids=[h[0][:50] for h in HUGE])
def test_huge_values_are_refused_before_they_are_built(source, what):
    message = _render(source, seconds=5.0)
    assert "was stopped on line 1:" in message
    assert what in message, message


def test_the_size_limit_grows_with_the_conversation():
    big = [{"role": "user", "content": "x" * 5_000_000}, {"role": "assistant", "content": "y" * 5_000_000}]
    text, spans = ChatTemplate(CHATML_TEMPLATE).render_with_spans(big)
    assert len(text) > 10_000_000 and len(spans) == 1
    # four copies of a 10M-character conversation are within its budget, 4000 are not
    assert len(ChatTemplate("{{ (messages|string) * 4 }}").render(big)) > 40_000_000
    with pytest.raises(TemplateError, match="the \\* operator would make"):
        ChatTemplate("{{ (messages|string) * 4000 }}").render(big)


def test_long_templates_are_refused():
    with pytest.raises(TemplateError) as err:
        ChatTemplate("{{ x }}" * 20_000)
    assert str(err.value) == (
        "chat template is 140,000 characters long; templates up to 131,072 characters are accepted"
    )


def test_messages_a_template_raises_are_one_line():
    with pytest.raises(TemplateError) as err:
        ChatTemplate("{{ raise_exception('first\\nsecond' * 1000) }}").render([])
    message = str(err.value)
    assert message.startswith("chat template raised: first\\nsecondfirst") and "\n" not in message
    assert len(message) < 600


@pytest.mark.parametrize(
    "source",
    ["{% if 1 %}" * 5000, "{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}", "{{ x" + ".y" * 20000 + " }}"],
)
def test_deeply_nested_templates_fail_cleanly(source):
    start = time.monotonic()
    try:
        ChatTemplate(source).render(MESSAGES)
    except TemplateError as exc:
        assert "\n" not in str(exc)
    assert time.monotonic() - start < 10


# -- the sandbox ------------------------------------------------------------------------------------

ESCAPES = [
    "{{ ().__class__.__bases__[0].__subclasses__() }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__.os }}",
    "{{ joiner.__init__.__globals__ }}",
    "{{ namespace.__init__.__globals__ }}",
    "{{ cycler.next.__self__ }}",
    "{{ cycler.reset.__func__.__globals__ }}",
    "{{ ''|attr('__class__')|attr('__mro__') }}",
    "{{ ''|attr('\\x5f\\x5fclass\\x5f\\x5f') }}",
    "{{ ''['__class__'] }}",
    "{{ '{0.__class__.__mro__}'.format('') }}",
    "{{ '{0.__globals__}'.format(raise_exception) }}",
    "{{ '{0.__init__.__globals__[os]}'.format(cycler) }}",
    "{{ '{x.__class__}'.format_map({'x': 1}) }}",
    "{{ '%s'|format(cycler.__init__) }}",
    "{{ self.__init__.__globals__ }}",
    "{{ self._TemplateReference__context }}",
    "{{ lipsum.__globals__['os'].popen('id').read() }}",
    "{{ (range(3)|map('string')).gi_frame.f_globals }}",
    "{{ raise_exception.__code__.co_consts }}",
    "{{ strftime_now.__closure__ }}",
    "{{ dict.__call__.__globals__ }}",
    "{{ dict.fromkeys.__self__ }}",
    "{% for m in messages %}{{ loop.__class__ }}{{ loop._iterator }}{% endfor %}",
    "{{ namespace(a=1).__dict__ }}",
    "{% macro m() %}{% endmacro %}{{ m.__init__.__globals__ }}",
    "{{ 'x'.format.__globals__ }}",
    "{{ [].copy.__self__.__class__ }}",
]
LEAKS = (
    "<class",
    "module",
    "<function",
    "built-in",
    "frame",
    "__builtins__",
    "os.",
    "code object",
    "<Namespace",
)


@pytest.mark.parametrize("source", ESCAPES)
def test_classic_escapes_stay_refused(source):
    messages = [{"role": "user", "content": "x"}]
    try:
        out = ChatTemplate(source).render(messages)
    except TemplateError as exc:
        assert "sandbox" in str(exc) or "Undefined" in str(exc) or "has no attribute" in str(exc)
    else:
        assert not any(leak in out for leak in LEAKS), out
    assert messages == [{"role": "user", "content": "x"}]


def test_the_guards_are_no_way_out():
    # the guard filters are reachable by name, and give nothing but what they are given
    out = ChatTemplate(
        "{{ 'a'|__tune_out }}{{ 'b'|__tune_concat('c') }}{% for x in [1]|__tune_iter %}{{ x }}{% endfor %}"
    )
    assert out.render([]) == "abc1"
    with pytest.raises(TemplateError, match="sandbox"):
        ChatTemplate("{{ ([1]|__tune_iter)._it.__class__.__mro__ }}").render([])


# -- spans of long conversations --------------------------------------------------------------------


def _case(name: str) -> dict:
    return next(c for c in EXPECTED["cases"] if c["id"].split("|")[1] == name)


def _long(name: str, times: int) -> tuple[list[dict], dict]:
    case = _case(name)
    messages = case["messages"]
    head = [m for m in messages[:1] if m["role"] == "system"]
    return head + messages[len(head) :] * times, case.get("kwargs") or {}


LONG = ["system_two_turns", "two_turns_no_system", "tool_call_round_trip", "reasoning_in_content", "unicode"]


@pytest.mark.parametrize("template_file", sorted(p.name for p in TEMPLATE_DIR.glob("*.jinja")))
def test_windowed_spans_equal_the_whole_conversations(template_file, monkeypatch):
    template = ChatTemplate(
        (TEMPLATE_DIR / template_file).read_text(encoding="utf-8"),
        bos_token="<s>",
        eos_token="</s>",
        now=lambda: chat_template.datetime(2024, 7, 26),
    )
    repeated = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hi"}] * 12
    conversations = [_long(name, 10) for name in LONG] + [(repeated, {})]
    found = []
    for messages, kwargs in conversations:
        try:
            found.append(template.render_with_spans(messages, **kwargs))
        except TemplateError as exc:
            found.append(str(exc))
    monkeypatch.setattr(chat_template, "_EXACT_REPLIES", 10**9)
    for (messages, kwargs), fast in zip(conversations, found, strict=True):
        try:
            exact = template.render_with_spans(messages, **kwargs)
        except TemplateError as exc:
            exact = str(exc)
        assert fast == exact

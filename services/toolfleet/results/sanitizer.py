"""Sanitization of a result's string fields, by field path (rules compiled once).

Each :class:`~toolfleet.contract.result_rules.Check` is one regular expression of named
alternatives compiled at import; a group's name is the rule id a finding reports
(``html__script`` is ``html.script``). Detection runs on the text with invisible
characters removed and NFKC-normalized, so ``ig<U+200B>nore previous instructions`` or
full-width angle brackets do not slip through. Every quantifier is bounded: a hostile
multi-megabyte string costs linear time.

Object keys are checked like values, under the rule of the field they name; two keys
that sanitize to the same text are refused (``key.collision``) rather than merged.

A :class:`Finding` names the rule and the field path, never the value: findings travel
in outcome warnings, error details and audit events.
"""

from __future__ import annotations

import html
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Any

from toolfleet.contract.result_rules import (
    ANY_INDEX,
    ANY_KEY,
    DEFAULT_PATH,
    Check,
    PathPattern,
    SanitizeAction,
    SanitizeRule,
    key_segment,
    parse_path,
)
from toolfleet.errors import ResultSanitizationRejected

REDACTED = "[REDACTED]"
KEY_MARK = "{key}"
"""Appended to an object's path when a finding is in one of its keys: ``$.meta{key}``."""
_MAX_REPORTED = 50

_CMD = (
    r"(?:rm|curl|wget|sh|bash|zsh|nc|ncat|python\d?|perl|ruby|php|chmod|chown|sudo|eval|exec"
    r"|mkfifo|dd)"
)

_PATTERNS: dict[Check, str] = {
    Check.HTML: "|".join(
        (
            r"(?P<html__script><\s{0,5}/?\s{0,5}script\b)",
            r"(?P<html__event_handler><[a-z][^<>]{0,300}?\son[a-z]{3,20}\s{0,5}=)",
            r"(?P<html__javascript_url>\b(?:javascript|vbscript)\s{0,5}:|data\s{0,5}:\s{0,5}text/html)",
            r"(?P<html__active_element><\s{0,5}(?:iframe|object|embed|svg|math|base|meta|link|style"
            r"|form|frame|frameset|applet)\b)",
        )
    ),
    Check.SQL: "|".join(
        (
            r"(?P<sql__tautology>'\s{0,10}(?:or|and)\s{1,10}(?:'[^']{0,20}'|\d{1,10}|[a-z_]\w{0,20})"
            r"\s{0,10}(?:=|<>|!=|like\b)\s{0,10}(?:'[^']{0,20}|\d{1,10}|[a-z_]\w{0,20}))",
            r"(?P<sql__stacked_statement>;\s{0,10}(?:drop\s{1,10}(?:table|database|schema|index|view)"
            r"|delete\s{1,10}from|insert\s{1,10}into|update\s{1,10}\w{1,64}\s{1,10}set"
            r"|truncate\s{1,10}table|alter\s{1,10}table|exec(?:ute)?\s{1,10}(?:xp|sp)_|shutdown\b))",
            r"(?P<sql__union_select>\bunion\s{1,10}(?:all\s{1,10})?select\b)",
            r"(?P<sql__comment_tail>'\s{0,10}(?:--|#|/\*))",
            r"(?P<sql__time_probe>\b(?:pg_sleep|sleep|benchmark|waitfor\s{1,10}delay)\s{0,5}\()",
        )
    ),
    Check.SHELL: "|".join(
        (
            r"(?P<shell__substitution>\$\([^()]{0,500}\)|\$\{[^{}]{0,200}\}"
            rf"|`\s{{0,5}}{_CMD}\b[^`]{{0,500}}`)",
            rf"(?P<shell__chained_command>(?:;|&&|\|\|)\s{{0,10}}(?:{_CMD}\s|cat\s{{1,10}}/))",
            r"(?P<shell__pipe_to_shell>\|\s{0,10}(?:sh|bash|zsh|python\d?|perl|sudo)\b)",
            r"(?P<shell__system_path>>{1,2}\s{0,10}/(?:etc|dev|bin|usr|root|var|boot)/"
            r"|/etc/(?:passwd|shadow|sudoers)\b)",
        )
    ),
    Check.PROMPT_INJECTION: "|".join(
        (
            r"(?P<prompt__ignore_instructions>\b(?:ignore|disregard|forget|override|bypass)\s{1,10}"
            r"(?:(?:all|any|the|your|of|these|those|my)\s{1,10}){0,3}"
            r"(?:previous|prior|above|earlier|preceding|system|original|existing)\s{1,10}"
            r"(?:instructions?|prompts?|messages?|context|rules|directions|guidelines|commands))",
            r"(?P<prompt__role_override>\byou\s{1,10}are\s{1,10}now\s{1,10}(?:in\s{1,10})?"
            r"(?:developer\s{1,10}mode|dan\b|jailbroken|unrestricted)"
            r"|\bnew\s{1,10}(?:system\s{1,10})?instructions\s{0,5}:)",
            r"(?P<prompt__special_token><\|[a-z_]{2,30}\|>|\[/?inst\]|<</?sys>>)",
            r"(?P<prompt__fake_tag><\s{0,5}/?\s{0,5}(?:tool|tool_call|tool_result|tool_response"
            r"|function_call|function_results?|functions|system|assistant|user|human|instructions?)"
            r"\b[^<>]{0,100}>)",
            r"(?P<prompt__role_header>(?:^|\n)[ \t]{0,10}(?:#{1,6}[ \t]{0,5})?"
            r"(?:(?-i:SYSTEM|ASSISTANT|DEVELOPER)|(?:system|developer)\s{1,5}(?:message|prompt))"
            r"[ \t]{0,5}:)",
        )
    ),
    Check.INVISIBLE: "|".join(
        (
            r"(?P<unicode__tag_characters>[\U000E0000-\U000E007F])",
            r"(?P<unicode__zero_width>[\u200B-\u200D\u2060-\u2064\uFEFF\u180E])",
            r"(?P<unicode__bidi_control>[\u202A-\u202E\u2066-\u2069])",
        )
    ),
}

#: Compiled once, at import.
_DETECTORS: dict[Check, re.Pattern[str]] = {
    check: re.compile(pattern, 0 if check is Check.INVISIBLE else re.IGNORECASE)
    for check, pattern in _PATTERNS.items()
}
#: Substrings (of the lower-cased, normalized text) without which a check cannot match:
#: most text has none of them, and ``in`` is far cheaper than the alternations above.
_TRIGGERS: dict[Check, tuple[str, ...]] = {
    Check.HTML: ("<", ":"),
    Check.SQL: ("'", ";", "union", "sleep", "benchmark", "waitfor"),
    Check.SHELL: ("$", "`", ";", "&", "|", ">", "/etc/"),
    Check.PROMPT_INJECTION: (
        "<",
        "[",
        ":",
        "ignore",
        "disregard",
        "forget",
        "override",
        "bypass",
        "now",
    ),
}
_INVISIBLE = _DETECTORS[Check.INVISIBLE]
#: Findings with no escaped form (a phrase, a statement): escaping removes them.
_NO_ESCAPED_FORM = frozenset(
    {
        "prompt__ignore_instructions",
        "prompt__role_override",
        "prompt__role_header",
        "sql__stacked_statement",
        "sql__union_select",
        "sql__time_probe",
    }
)
_DEFANG = str.maketrans({"<": "\u2039", ">": "\u203a", "|": "\u00a6", "[": "\u27e6", "]": "\u27e7"})
_SHELL_META = re.compile(r"([`$;&|<>()\\!])")
_ESCAPE_ORDER = (Check.SHELL, Check.SQL, Check.HTML)


def rule_id(group: str) -> str:
    return group.replace("__", ".", 1)


@dataclass(frozen=True, slots=True)
class Finding:
    """One rule that matched one field: what is audited (never the value)."""

    rule: str
    """``html.script``, ``prompt.fake_tag``, ``unicode.tag_characters`` ..."""
    field: str
    """The field's path, ``$.items[2].title``."""
    action: SanitizeAction


@dataclass(slots=True)
class Sanitized:
    value: Any
    findings: list[Finding] = field(default_factory=list)

    def warnings(self, limit: int = 20) -> list[str]:
        """One line per finding that changed the result (``reject`` never gets here)."""
        verbs = {SanitizeAction.ESCAPE: "escaped", SanitizeAction.REDACT: "redacted"}
        lines = [
            f"result field {f.field}: {f.rule} {verbs[f.action]}"
            for f in self.findings
            if f.action in verbs
        ]
        if len(lines) > limit:
            lines = [*lines[:limit], f"... and {len(lines) - limit} more sanitization findings"]
        return lines


def scan(text: str, checks: tuple[Check, ...]) -> tuple[str, list[str]]:
    """The normalized text the detectors see, and the rule ids that match it."""
    found: list[str] = []
    if text.isascii():  # no invisible character, and NFKC would change nothing
        probe = text
    else:
        if Check.INVISIBLE in checks:
            found.extend(_rules(_INVISIBLE, text))
        probe = unicodedata.normalize("NFKC", _INVISIBLE.sub("", text))
    lowered = probe.lower()
    for check in checks:
        if check is not Check.INVISIBLE and any(t in lowered for t in _TRIGGERS[check]):
            found.extend(_rules(_DETECTORS[check], probe))
    return probe, found


def _rules(pattern: re.Pattern[str], text: str) -> list[str]:
    seen: dict[str, None] = {}
    for match in pattern.finditer(text):
        if match.lastgroup is not None:
            seen.setdefault(rule_id(match.lastgroup), None)
    return list(seen)


def redacted(probe: str, checks: tuple[Check, ...]) -> str:
    """``probe`` with every finding replaced by ``[REDACTED]``."""
    for check in checks:
        if check is not Check.INVISIBLE:
            probe = _DETECTORS[check].sub(_redact, probe)
    return probe


def escaped(probe: str, rules: list[str]) -> str:
    """``probe`` made inert for the sinks its findings aim at."""
    found = {r.split(".", 1)[0] for r in rules}
    if "prompt" in found:
        probe = _DETECTORS[Check.PROMPT_INJECTION].sub(_defang, probe)
    if "sql" in found:
        probe = _DETECTORS[Check.SQL].sub(_defang, probe)
    if "shell" in found:
        probe = _SHELL_META.sub(r"\\\1", probe)
    if "sql" in found:
        probe = probe.replace("'", "''")
    if "html" in found:
        probe = html.escape(probe, quote=True)
    return probe


def _redact(match: re.Match[str]) -> str:
    # Keep a line break a role header matched on, so lines stay lines.
    return ("\n" if match.group(0).startswith("\n") else "") + REDACTED


def _defang(match: re.Match[str]) -> str:
    if match.lastgroup in _NO_ESCAPED_FORM:
        return _redact(match)
    if match.lastgroup in ("prompt__special_token", "prompt__fake_tag"):
        return match.group(0).translate(_DEFANG)
    return match.group(0)  # escaped below, with the rest of the text


class CompiledSanitizer:
    """One tool's sanitization rules, paths parsed once; :meth:`apply` walks a result."""

    def __init__(self, rules: dict[str, SanitizeRule]) -> None:
        self._default = rules.get(DEFAULT_PATH)
        self._rules: list[tuple[PathPattern, SanitizeRule]] = sorted(
            ((parse_path(p), r) for p, r in rules.items() if p != DEFAULT_PATH),
            key=lambda item: (-len(item[0]), sum(s in (ANY_KEY, ANY_INDEX) for s in item[0])),
        )

    @property
    def empty(self) -> bool:
        return self._default is None and not self._rules

    def rule_for(self, path: tuple[str | int, ...]) -> SanitizeRule | None:
        """The most specific rule covering ``path`` (``*`` when none names it)."""
        for pattern, rule in self._rules:
            if len(pattern) <= len(path) and all(
                _segment_matches(want, got) for want, got in zip(pattern, path, strict=False)
            ):
                return rule
        return self._default

    def apply(self, result: Any) -> Sanitized:
        """``result`` with escape/redact rules applied and every finding listed.

        Raises:
            ResultSanitizationRejected: a ``reject`` rule matched; the details list each
                rule id and field path.
        """
        out = Sanitized(value=result)
        if self.empty:
            return out
        out.value = self._walk(result, (), out.findings)
        rejected = [f for f in out.findings if f.action is SanitizeAction.REJECT]
        if rejected:
            named = "; ".join(f"{f.rule} at {f.field}" for f in rejected[:5])
            more = f" and {len(rejected) - 5} more" if len(rejected) > 5 else ""
            raise ResultSanitizationRejected(
                f"the result was rejected by its sanitization rules: {named}{more}",
                details={
                    "findings": [{"rule": f.rule, "field": f.field} for f in rejected][
                        :_MAX_REPORTED
                    ]
                },
            )
        return out

    def _walk(self, value: Any, path: tuple[str | int, ...], findings: list[Finding]) -> Any:
        if isinstance(value, dict):
            out: dict[str, Any] = {}
            for key, item in value.items():
                name = self._text(key, (*path, key), findings, key_of=path)
                if name in out:  # two keys sanitized into one: refuse rather than drop one
                    findings.append(
                        Finding(
                            rule="key.collision",
                            field=render_path(path) + KEY_MARK,
                            action=SanitizeAction.REJECT,
                        )
                    )
                out[name] = self._walk(item, (*path, key), findings)
            return out
        if isinstance(value, list):
            return [self._walk(v, (*path, i), findings) for i, v in enumerate(value)]
        if isinstance(value, str):
            return self._text(value, path, findings)
        return value

    def _text(
        self,
        text: str,
        path: tuple[str | int, ...],
        findings: list[Finding],
        *,
        key_of: tuple[str | int, ...] | None = None,
    ) -> str:
        """``text`` (a value, or the key of an object at ``key_of``) under its rule."""
        rule = self.rule_for(path)
        if rule is None or rule.action is SanitizeAction.ALLOW:
            return text
        probe, rules = scan(text, rule.checks)
        if not rules:
            return text
        where = render_path(path) if key_of is None else render_path(key_of) + KEY_MARK
        findings.extend(Finding(rule=r, field=where, action=rule.action) for r in rules)
        if rule.action is SanitizeAction.REDACT:
            return redacted(probe, rule.checks)
        if rule.action is SanitizeAction.ESCAPE:
            return escaped(probe, rules)
        return text


def _segment_matches(want: str | int, got: str | int) -> bool:
    if want == ANY_KEY:
        return isinstance(got, str)
    if want == ANY_INDEX:
        return isinstance(got, int)
    return want == got


def render_path(path: tuple[str | int, ...]) -> str:
    """``("items", 2, "title")`` as ``$.items[2].title`` (odd keys as ``*``)."""
    return "$" + "".join(f"[{p}]" if isinstance(p, int) else key_segment(p) for p in path)

"""What the shipped monitoring files ask Prometheus for: the series each PromQL expression of
configs/deploy/prometheus/alerts.yml and configs/deploy/grafana/replay-proxy.json selects, with
their label matchers, so a test can hold them against a real scrape.

A small lexer, not a full PromQL parser: identifiers followed by ``(`` are functions or
aggregations, ``by (...)``/``without (...)``/``on (...)``/``ignoring (...)``/``group_left (...)``/
``group_right (...)`` hold label names, ``[...]`` holds a range, strings and numbers are values;
every other identifier is a series name. Grafana's variables (``$target``, ``${x}``,
``$__rate_interval``) only ever stand in strings and ranges here."""

from __future__ import annotations

import json
import re
from pathlib import Path

import attrs
import yaml

REPO = Path(__file__).resolve().parents[2]
ALERTS = REPO / "configs/deploy/prometheus/alerts.yml"
DASHBOARD = REPO / "configs/deploy/grafana/replay-proxy.json"

_TOKEN = re.compile(
    r"""\s*(?:(?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')|(?P<range>\[[^\]]*\])|(?P<number>\d+(?:\.\d+)?(?:e[+-]?\d+|ms|[smhdwy])?)"""
    r"""|(?P<ident>[a-zA-Z_:][a-zA-Z0-9_:]*)|(?P<op>=~|!~|!=|==|>=|<=|[-+*/%^(){},=<>]))""",
    re.VERBOSE,
)
_KEYWORDS = {"and", "or", "unless", "bool", "offset"}
# Aggregations may take their ``by (...)`` before the parenthesis: ``sum by (le) (...)``.
_AGGREGATIONS = {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk",
                 "quantile", "limitk", "limit_ratio"}  # fmt: skip
_LABEL_LISTS = {"by", "without", "on", "ignoring", "group_left", "group_right"}


@attrs.frozen
class Selector:
    """``name{label op "value", ...}`` as written in an expression."""

    name: str
    matchers: tuple[tuple[str, str, str], ...] = ()  # (label, op, value without quotes)


def tokens(expr: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    expr = expr.rstrip()
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if m is None or m.end() == pos:
            raise ValueError(f"cannot read the expression at {expr[pos:]!r}: {expr!r}")
        kind = m.lastgroup
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


def selectors(expr: str) -> list[Selector]:
    """The series ``expr`` selects (``up`` included: callers decide what is whose)."""
    toks, out, i = tokens(expr), [], 0
    while i < len(toks):
        kind, text = toks[i]
        following = toks[i + 1][1] if i + 1 < len(toks) else None
        if kind == "ident" and text in _LABEL_LISTS and following == "(":
            i = toks.index(("op", ")"), i) + 1  # a list of label names
            continue
        if kind == "ident" and (following == "(" or text in _KEYWORDS or text in _AGGREGATIONS):
            i += 1  # a function, an aggregation, a keyword
            continue
        if kind == "ident":
            matchers = []
            i += 1
            if following == "{":
                close = toks.index(("op", "}"), i)
                inner = [t for t in toks[i + 1 : close] if t != ("op", ",")]
                for j in range(0, len(inner), 3):
                    (_, label), (_, op), (_, value) = inner[j : j + 3]
                    matchers.append((label, op, value[1:-1]))
                i = close + 1
            out.append(Selector(text, tuple(matchers)))
            continue
        i += 1
    return out


def grouping_labels(expr: str) -> set[str]:
    """The label names of ``expr``'s ``by``/``without``/``on``/``ignoring``/``group_*`` lists."""
    toks, out = tokens(expr), set()
    for i, (kind, text) in enumerate(toks):
        if kind == "ident" and text in _LABEL_LISTS and i + 1 < len(toks) and toks[i + 1] == ("op", "("):
            close = toks.index(("op", ")"), i)
            out |= {t for k, t in toks[i + 2 : close] if k == "ident"}
    return out


def alert_expressions() -> dict[str, str]:
    """{alert name: expression} of alerts.yml."""
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return {rule["alert"]: rule["expr"] for group in groups for rule in group["rules"]}


def dashboard_expressions() -> dict[str, str]:
    """{where: PromQL} of every panel target of the dashboard; template variable queries as
    their ``label_values(<expression>, <label>)`` expression (``where`` ends in ``:label=<label>``)."""
    dashboard = json.loads(DASHBOARD.read_text())
    out: dict[str, str] = {}
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            out[f"panel {panel['title']!r} {target['refId']}"] = target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        query = variable["query"]["query"] if isinstance(variable["query"], dict) else variable["query"]
        m = re.fullmatch(r"label_values\((.*),\s*([a-zA-Z_]\w*)\)", query)
        if m is None:
            raise ValueError(f"variable {variable['name']}: not a label_values(...) query: {query!r}")
        out[f"variable {variable['name']}:label={m.group(2)}"] = m.group(1)
    return out


def as_prometheus_would_run_it(expr: str) -> str:
    """A dashboard expression with Grafana's variables replaced, for promtool to parse."""
    expr = expr.replace("$__rate_interval", "5m").replace("$__interval", "1m")
    return re.sub(r"\$\{?\w+\}?", ".*", expr)

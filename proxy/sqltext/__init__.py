"""SQL text, judged the way the connected server reads it: one lexer, one classifier, one
splitter for the proxy and the plugins.

- ``dialect``: which server reads the text (executable comments run or not by its version);
- ``lexer``: tokens, statement splitting; ``tokens``: helpers over token lists;
- ``classify``: what each statement does (``analyze`` a whole text, ``classify`` one statement),
  with ``statement`` (the judgements), ``expressions`` (calls and effects of expressions) and
  ``txcontrol`` (BEGIN, COMMIT, savepoints, XA);
- ``triage``: the hot path (a statement that needs no analysis);
- ``setstmt``: SET parsing and rendering; ``inserts``: INSERT/REPLACE heads;
- ``idempotence``: safe mode's claim (text) and proof (table keys);
- ``split``: cutting an oversized multi-row INSERT into pieces.
"""

from proxy.sqltext.classify import ServerReading, analyze, classify
from proxy.sqltext.dialect import MARIADB, UNKNOWN, Dialect
from proxy.sqltext.idempotence import is_idempotent
from proxy.sqltext.inserts import InsertHead, parse_insert_head
from proxy.sqltext.lexer import (
    TRIVIA,
    SqlLexError,
    SqlParseError,
    SqlUnknown,
    Token,
    TokenKind,
    iter_tokens,
    quoted_string,
    split_statements,
    tokenize,
)
from proxy.sqltext.setstmt import SetAssignment, SetScope, parse_set, render_set
from proxy.sqltext.statement import TRANSACTION_KINDS, Analysis, Kind, Statement
from proxy.sqltext.tokens import leading_keywords, quote_ident, quote_string

__all__ = [
    "Analysis", "Dialect", "InsertHead", "Kind", "MARIADB", "SetAssignment", "SetScope", "SqlLexError",
    "ServerReading", "SqlParseError", "SqlUnknown", "Statement", "TRANSACTION_KINDS", "TRIVIA", "Token", "TokenKind", "UNKNOWN",
    "analyze", "classify", "is_idempotent", "iter_tokens", "leading_keywords", "parse_insert_head", "parse_set",
    "quote_ident", "quote_string", "quoted_string", "render_set", "split_statements", "tokenize",
]  # fmt: skip

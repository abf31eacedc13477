"""The hot path: which statements need no analysis at all.

Most statements a replicator sends are one INSERT / REPLACE / UPDATE / DELETE that starts
right with its verb. Such a statement cannot end or begin a transaction, and when the session
cannot send several statements at once (or there is no ``;`` in it) it is exactly one
statement. What such a statement calls is judged at recovery, from the journal.

A SELECT is on the fast path only when its bytes cannot hide anything but a plain read: no
``(`` anywhere (so no call of any function, stored or built-in), no ``@`` (variables), no
comment or ``;``, and none of the words that make a read lock or write (INTO, FOR UPDATE /
SHARE, LOCK IN SHARE MODE, NEXT VALUE FOR, seq.NEXTVAL). A byte inside a string literal counts
too: such a SELECT is simply analyzed. Everything else (a leading comment or space, any other
verb, a possible multi-statement) goes through ``classify.analyze``, so the two never
disagree: the fast path only answers when the answer is certain.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["fast_verb", "FAST_VERBS", "may_pin_session"]

FAST_VERBS: Final = frozenset({b"INSERT", b"REPLACE", b"UPDATE", b"DELETE", b"SELECT"})
# What keeps a SELECT off the fast path (see above), by the first byte that can begin it: one
# of "(@;#" (1), "/*" (2), "--" (3), the words INTO, FOR, LOCK, NEXT[VAL] in any case, also
# inside a longer word (4: a SELECT that only looks doubtful is simply analyzed). One walk of
# the text: compiled, about ten instructions a byte; one regex for it all walked a point
# select at ~400 (callgrind), ten memchr scans cost ~1.5k instructions a call each.
_DOUBT_START: Final = bytes(
    1 if chr(c) in "(@;#" else 2 if chr(c) == "/" else 3 if chr(c) == "-" else 4 if chr(c) in "IFLNifln" else 0 for c in range(256)
)
_DOUBT_WORDS: Final = (b"INTO", b"LOCK", b"NEXT")  # and FOR
_SPACE: Final = b" \t\n\r\f\v"


def fast_verb(payload: bytes, multi: bool) -> bytes | None:
    """The upper-cased verb of a COM_QUERY ``payload`` (command byte first) that needs no
    analysis, or None. ``multi``: the session may send several statements per command."""
    # The verb: six or seven ASCII letters right after the command byte, then whitespace
    # (FAST_VERBS' lengths). Read byte by byte: compiled, a few hundred instructions; a regex
    # match, its group and their method calls cost ~2.7k (callgrind).
    n = len(payload)
    end = 1
    while end < n and end < 9 and 97 <= payload[end] | 0x20 <= 122:
        end += 1
    if not 7 <= end <= 8 or end == n or payload[end] not in _SPACE:
        return None
    verb = payload[1:end].upper()
    if verb not in FAST_VERBS:
        return None
    if verb == b"SELECT":
        return None if _select_doubt(payload, end + 1) else verb
    if multi and payload.find(b";") >= 0:  # (find, not ``in``: see may_pin_session)
        return None
    return verb


def _select_doubt(payload: bytes, start: int) -> bool:
    n = len(payload)
    for i in range(start, n):
        kind = _DOUBT_START[payload[i]]
        if not kind:
            continue
        if kind == 1:
            return True
        if kind == 2 or kind == 3:
            if i + 1 < n and payload[i + 1] == (0x2A if kind == 2 else 0x2D):  # "/*", "--"
                return True
        else:
            word = payload[i : i + 4].upper()
            if word in _DOUBT_WORDS or word[:3] == b"FOR":
                return True
    return False


# Bytes a statement must contain to make its session impossible to restore (a named lock, a
# user variable assigned in a query), looked for before the classifier is asked. Two memchr
# scans, then a regex only from the first "_": one regex for both (its first byte a class)
# walked a 100-row REPLACE at ~10 instructions a byte (callgrind). A two-byte needle (":=") is
# not a memchr scan: it is looked for only where an "@" is.
_LOCK: Final = re.compile(rb"_[Ll][Oo][Cc][Kk]")


def may_pin_session(payload: bytes) -> bool:
    """Could this fast-path statement pin the session (GET_LOCK(), @v := ...)?"""
    # Only a user variable (@v := ...) pins; memchr for "@" first. ``find``, not ``in``: bytes'
    # ``in`` tries the needle as an int first, and a bytes needle costs it a TypeError raised
    # and cleared (~1.8k instructions, callgrind).
    if payload.find(b"@") >= 0 and payload.find(b":=") >= 0:
        return True
    underscore = payload.find(b"_")
    return underscore >= 0 and _LOCK.search(payload, underscore) is not None

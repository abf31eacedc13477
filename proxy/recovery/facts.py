"""What recovery needs to know about one command of a session (``StatementFacts`` for
``proxy.recovery.plan.plan_recovery``), from the judgement of its text made when it ran.

A command's facts are computed once, at the first loss that needs them, and kept with it
(``JournalEntry.facts``, ``Inflight.facts``): the hot path pays nothing, and a loss after a
loss reads them again. The plugins' answer to the safe-mode question is asked once per
statement text per loss (``PluginAnswers``), here and by the proofs alike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from proxy.protocol.constants import Commands
from proxy.recovery.ddljobs import job_text
from proxy.recovery.plan import StatementFacts
from proxy.session.completed import SESSION_ONLY_COMMANDS
from proxy.session.transaction import JournalEntry
from proxy.sqltext import Analysis, Kind
from proxy.sqltext.claims import claim
from proxy.sqltext.idempotence import repeatable

if TYPE_CHECKING:
    from proxy.cycle.inflight import Inflight
    from proxy.hooks import Hooks
    from proxy.session.info import SessionInfo

__all__ = ["statement_facts", "facts_of", "PluginAnswers"]

C = Commands


class PluginAnswers:
    """The plugins' answers to the safe-mode question (``Hooks.idempotent``: True, False, or
    None when they leave it to the built-in rules), asked at most once per statement text in
    one loss."""

    def __init__(self, hooks: Hooks, info: SessionInfo) -> None:
        self._hooks = hooks
        self._info = info
        self._known: dict[str, bool | None] = {}

    async def idempotent(self, text: str) -> bool | None:
        if not self._hooks.is_idempotent:
            return None
        if text not in self._known:
            self._known[text] = await self._hooks.idempotent(self._info, text)
        return self._known[text]


async def facts_of(command: JournalEntry | Inflight, safe_mode: bool, answers: PluginAnswers) -> StatementFacts:
    """The facts of a journaled or in-flight command, from its judgement when it ran, with the
    plugins' answer to the safe-mode question: computed once, then kept with the command."""
    if command.facts is None:
        complete = isinstance(command, JournalEntry) or command.command.complete  # a journal keeps whole commands only
        analysis = command.judged()
        answer = await answers.idempotent(analysis.text) if safe_mode and complete and analysis is not None else None
        command.facts = statement_facts(command.payload[0], analysis, complete=complete, safe_mode=safe_mode, idempotent=answer)
    return command.facts


def statement_facts(code: int, analysis: Analysis | None, *, complete: bool = True, safe_mode: bool = False,
                    idempotent: bool | None = None) -> StatementFacts:  # fmt: skip
    """What recovery needs to know about one command of the session, from the judgement made
    when it ran (``JournalEntry.judged``, ``Inflight.judged``: the text as the server read it
    then). ``idempotent``: a plugin's answer to the safe-mode question (None: the built-in
    rules decide)."""
    if code in SESSION_ONLY_COMMANDS:
        return StatementFacts(writes=False, idempotent=True, session_only=True)
    if code == C.COM_QUERY and not complete:  # spooled: only its head is in memory, and the rest may call or write anything
        return StatementFacts(commits=True, writes=True, unknown="a statement over limits.spool_threshold, judged by its head only")
    if analysis is None or code not in (C.COM_QUERY, C.COM_STMT_EXECUTE):
        return StatementFacts()
    first = analysis.first
    if analysis.unknown is not None:
        return StatementFacts(commits=True, writes=True, unknown=analysis.unknown)
    if any(st.runs_code for st in analysis.statements):
        return StatementFacts(commits=True, writes=True, unknown="it runs stored code (a routine, a stored function)")
    ended = False
    commits = False
    for st in analysis.statements:
        # A write after a statement that ended the transaction runs in autocommit mode.
        commits |= st.may_commit or (ended and st.writes)
        ended |= st.may_end_transaction
    plain_rollback = analysis.single and first.kind is Kind.ROLLBACK and not first.release
    text = analysis.text
    if not (safe_mode and complete) or first.xa is not None:
        idem = False
    elif not analysis.writes:
        idem = True
    elif idempotent is not None:
        idem = idempotent
    else:
        idem = all(
            repeatable(text[a:b], analysis.dialect, analysis.nbe) or claim(text[a:b], analysis.dialect, analysis.nbe) is not None
            for a, b in analysis.spans
        )
    return StatementFacts(
        commits=commits,
        rollback=plain_rollback,
        writes=analysis.writes,
        idempotent=idem,
        session_only=analysis.session_only,
        ddl_job=code == C.COM_QUERY and job_text(analysis) is not None,
    )

"""An open transaction and its journal, exported for the new process of an upgrade and
adopted there (``Transaction.export`` / ``adopt``): after a JSON round trip the journal holds
the same commands, fingerprints, readings and statements (the new process's own objects), so
a loss there is judged and replayed as it would have been in the old process."""

from __future__ import annotations

import json

from proxy.protocol.response import Expect
from proxy.session.state import PreparedStatement, SessionState
from proxy.session.transaction import JournalEntry, Transaction
from proxy.sqltext import ServerReading
from proxy.sqltext.dialect import Dialect

READING = ServerReading(dialect=Dialect.from_server_version("8.0.11-TiDB-v8.5.3"), nbe=True, multi=False)


def statement(client_id: int) -> PreparedStatement:
    return PreparedStatement(client_id, b"\x16INSERT INTO t VALUES (?)", 1, 0, client_id + 100)


def round_trip(tx: Transaction, old: dict, new: dict) -> Transaction:
    moved = Transaction(1 << 20, 100)
    moved.adopt(json.loads(json.dumps(tx.export(old))), new)
    return moved


def test_the_journal_survives_the_round_trip():
    old = {5: statement(5)}
    tx = Transaction(1 << 20, 100)
    tx.start("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
    tx.record(JournalEntry(b"\x03BEGIN", Expect.QUERY, None, reading=READING))
    tx.record(JournalEntry(b"\x03INSERT INTO t VALUES (1)", Expect.QUERY, 12345, reading=READING))
    tx.record(JournalEntry(b"\x17\x05\x00\x00\x00", Expect.EXECUTE, 99, statement=old[5]))
    tx.writes = True
    tx.session_before = SessionState("app", "test", 45, variables={"time_zone": "'+05:30'"})
    new = {5: statement(5)}
    moved = round_trip(tx, old, new)
    assert moved.active and moved.writes and moved.prefix == tx.prefix
    assert moved.not_replayable is None and moved.in_doubt is None and moved.size == tx.size
    assert moved.session_before == tx.session_before
    assert [(e.payload, e.expect, e.fingerprint, e.reading) for e in moved.entries] == [
        (e.payload, e.expect, e.fingerprint, e.reading) for e in tx.entries
    ]
    assert moved.entries[2].statement is new[5]  # the new process's statement, not a copy of the old
    assert moved.entries[1].judged().first.kind.name == "INSERT"  # judged again from its text and reading


def test_no_transaction_exports_as_none():
    assert Transaction(1 << 20, 100).export({}) is None


def test_what_cannot_be_replayed_stays_so():
    tx = Transaction(1 << 20, 100)
    tx.start(None)
    tx.record(JournalEntry(b"\x03INSERT INTO t VALUES (1)", Expect.QUERY, 1, reading=READING))
    tx.mark_in_doubt("a stored routine ran")
    moved = round_trip(tx, {}, {})
    assert moved.active and moved.in_doubt == "a stored routine ran" and moved.not_replayable == "a stored routine ran"
    assert moved.entries == []


def test_a_statement_closed_since_its_entry_ran_makes_the_journal_unreplayable():
    closed = statement(5)
    tx = Transaction(1 << 20, 100)
    tx.start(None)
    tx.record(JournalEntry(b"\x17\x05\x00\x00\x00", Expect.EXECUTE, 1, statement=closed))
    moved = round_trip(tx, {}, {5: statement(5)})  # 5 was closed (and maybe prepared again) since
    assert moved.active and moved.not_replayable is not None and "closed" in moved.not_replayable
    assert moved.entries == []

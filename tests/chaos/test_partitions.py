"""Partitions and hung servers, for real, on MariaDB and on tidb-server: the server's port cut
off by netfilter (every packet dropped: no FIN, no RST, no ACK), or its process stopped
(SIGSTOP: the kernel still accepts connections and ACKs what it is sent, nothing answers).

The proxy notices by its health checks: no check of the address gets any answer for
``backend.dead_after``, so the connections opened there before are cut and each session
recovers as after any loss -- instead of waiting for TCP to give up (30 s with the proxy's
TCP_USER_TIMEOUT), or for ever on a hung server. Each case prints how long the proxy took to
notice (from the fault's start to its log line cutting the connections).

- the DM-like workload (go-sql-driver, commit markers) through repeated partitions and hangs:
  no client error, every row verified;
- an idle session through a partition: its next command sees nothing, its variables are kept;
- a command in flight through a partition longer than the buffer window: the client hears
  1158 when the window ends (the proxy cannot know whether it ran), not after the kernel's
  15 minutes, and nothing runs twice;
- a server that stops reading mid-command (a 24 MiB INSERT into a hung server): sent again
  once it answers, OK, the row there once;
- a first address that accepts TCP and never greets: logins go on to the second;
- a first address whose server answers a byte a second: found dead like a silent one, its
  idle sessions move to the second with their variables, a read in flight there is answered
  right or gets a connection error (never a wrong answer), new logins do not wait for it.

Skipped with one line where no rule can be made (no root, no iptables).
"""

from __future__ import annotations

import json
import time

import pymysql
import pytest
import trio

from tests.lab.chaos import assert_chaos_ok, fault_starts, hanging, noticed_after, partitioning, run_chaos, start_chaos_proxy, tidb_backend
from tests.lab.netfault import Hung, Partition, SilentListener, Trickle, heal_all, partition_unavailable_reason
from tests.lab.proxy import ProxyProcess

pytestmark = [pytest.mark.chaos, pytest.mark.integration]

DEAD_AFTER = 6.0
HEALTH_INTERVAL = 1.0
# From the fault to the cut: the first silent check starts within an interval, the cut comes
# with the first check that ends dead_after after it (a silent check lasts its timeout, the
# interval, and the next starts an interval later).
NOTICE_BOUND = DEAD_AFTER + 4 * HEALTH_INTERVAL + 1.0
DOWN = 10.0  # each fault of the workload runs
DURATION = 46.0
INTERVAL = 6.0  # between the end of one and the start of the next: three in the run
HUNG_FOR = 15.0  # the server stopped under a command being sent: past dead_after, within the window


@pytest.fixture(autouse=True)
def _netfilter():
    reason = partition_unavailable_reason()
    if reason:
        pytest.skip(f"partition tests skipped: {reason}")
    heal_all()
    yield
    heal_all()


def backend_keys(server) -> dict:
    keys = {"health_interval": f"{HEALTH_INTERVAL:g}s", "dead_after": f"{DEAD_AFTER:g}s"}
    if server.flavor == "tidb":
        keys.update(tidb_backend(server), health_interval=f"{HEALTH_INTERVAL:g}s")
    return keys


@pytest.mark.parametrize("fault", ["partition", "hang"])
async def test_the_dm_like_workload_rides_out_partitions_and_hung_servers(db_factory, goclient, tmp_path, fault):
    """Insert + counters with commit markers, 8 pinned connections, the server cut off (or
    stopped) for 10 s, three times: sessions in flight, in a transaction and idle all recover;
    no client error, no row lost or doubled, and each fault noticed within the bound."""
    server = db_factory()
    proxy = start_chaos_proxy(tmp_path / "proxy", server.port, backend=backend_keys(server), commit_marker=True)
    disrupt = partitioning(server.port, DOWN) if fault == "partition" else hanging(server, DOWN)
    started = time.time()
    try:
        result = await run_chaos(f"{fault}_{server.flavor}", server, proxy.port, tmp_path / "run", sql="insert",
                                 duration=DURATION, interval=INTERVAL, disrupt=disrupt)  # fmt: skip
    finally:
        log = proxy.stop()
    notice = noticed_after(fault_starts(result.restarts, started), log)
    print(json.dumps(result.summary(), indent=2))
    print(f"{fault} on {server.flavor}: noticed after {notice} s (bound {NOTICE_BOUND:g} s)")
    assert_chaos_ok(result, log, min_disruptions=2, min_txns=50)
    assert notice and all(n <= NOTICE_BOUND for n in notice), notice


def connect(port: int) -> pymysql.Connection:
    return pymysql.connect(host="127.0.0.1", port=port, user="app", password="apppw", database="test",
                           autocommit=True, read_timeout=600, write_timeout=600)  # fmt: skip


def start_proxy(tmp_path, server, **recovery) -> ProxyProcess:
    return ProxyProcess(tmp_path / "proxy", server.port, backend=backend_keys(server), recovery=recovery, log={"level": "info"}).start()


async def test_an_idle_session_sees_nothing_of_a_partition(db_factory, tmp_path):
    """Idle through a 20 s partition: its connection is cut once the address is found dead, it
    reconnects when the partition heals, and its next command finds its variable."""
    server = db_factory()
    proxy = start_proxy(tmp_path, server)
    try:
        conn = connect(proxy.port)
        with conn.cursor() as cur:
            cur.execute("SET @kept = 42")
            cur.execute("SELECT CONNECTION_ID()")
            before = cur.fetchone()[0]
        started = time.time()
        with Partition(server.port):
            await trio.sleep(20)
        await trio.sleep(3 * HEALTH_INTERVAL)  # the reconnect's backoff and restore
        t0 = time.monotonic()
        with conn.cursor() as cur:
            cur.execute("SELECT @kept, CONNECTION_ID()")
            kept, after = cur.fetchone()
        waited = time.monotonic() - t0
        conn.close()
    finally:
        log = proxy.stop()
    notice = noticed_after([started], log)
    print(f"idle through a 20 s partition on {server.flavor}: noticed after {notice} s; next command took {waited:.2f} s")
    assert kept == 42 and after != before
    assert waited < 1.0
    assert notice[0] <= NOTICE_BOUND, notice


async def test_a_transaction_through_a_partition_never_kills_the_server(db_factory, tmp_path):
    """A transaction that wrote 64 rows, idle through a 12 s partition: its old connection is
    still open on the server when the session comes back. On TiDB a KILL of it would crash
    tidb-server (pingcap/tidb#63956, on builds without the fix): the proxy leaves it to end
    on its own, replays the journal on a new connection, and the COMMIT lands every row once;
    the server stays up. On MariaDB the old connection is KILLed, as before."""
    server = db_factory()
    proxy = start_proxy(tmp_path, server)
    try:
        conn = connect(proxy.port)
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE IF NOT EXISTS doubled (id INT)")
            cur.execute("DELETE FROM doubled")
            cur.execute("BEGIN")
            cur.execute("INSERT INTO doubled VALUES (1)")
            for _ in range(6):
                cur.execute("INSERT INTO doubled SELECT * FROM doubled")
        with Partition(server.port):
            await trio.sleep(12)
        await trio.sleep(3 * HEALTH_INTERVAL)
        with conn.cursor() as cur:
            cur.execute("INSERT INTO doubled VALUES (2)")  # replayed first, on a new connection
            cur.execute("COMMIT")
        conn.close()
        assert server.query("SELECT COUNT(*), SUM(id) FROM test.doubled") == [(65, 66)]
        assert server.query("SELECT 1") == [(1,)]  # the server is up
    finally:
        log = proxy.stop()
    if server.flavor == "tidb":
        assert "not killing old backend connection" in log, log[-3000:]
        assert "killed old backend connection" not in log
    assert "replayed" in log, log[-3000:]


async def _heal_after(partition: Partition, seconds: float) -> None:
    try:
        await trio.sleep(seconds)
    finally:
        partition.heal()


async def test_a_command_in_flight_through_a_partition(db_factory, tmp_path):
    """Commands sent into a partition, one backend, buffer window 15 s:

    - an INSERT (autocommit) whose answer never comes: once the cut comes, the proxy cannot
      know whether it ran, so 1158 at once (not after the window, nor TCP's timeout); after the
      partition the row is not there (no byte of it reached the server, and the connection
      was reset, so the kernel does not deliver it later);
    - a read through a partition shorter than the window: answered once it heals;
    - a read through one longer than the window: an error when the window ends."""
    server = db_factory()
    setup = pymysql.connect(host="127.0.0.1", port=server.port, user="app", password="apppw", database="test", autocommit=True)
    with setup.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS part_w")
        cur.execute("CREATE TABLE part_w (id INT PRIMARY KEY, v INT)")
    proxy = start_proxy(tmp_path, server, buffer_window="15s")
    outcomes: dict[str, tuple] = {}

    async def through(label: str, sql: str, partition_s: float) -> None:
        conn = connect(proxy.port)

        def run() -> tuple:
            with conn.cursor() as cur:
                cur.execute(sql)
                return cur.fetchall()

        async with trio.open_nursery() as nursery:
            partition = Partition(server.port).cut()
            try:
                nursery.start_soon(_heal_after, partition, partition_s)
                t0 = time.monotonic()
                try:
                    outcomes[label] = ("ok", await trio.to_thread.run_sync(run), round(time.monotonic() - t0, 1))
                except pymysql.err.MySQLError as exc:
                    outcomes[label] = ("error", exc.args[0], round(time.monotonic() - t0, 1))
            except BaseException:
                partition.heal()
                raise
        await trio.sleep(3 * HEALTH_INTERVAL)
        conn.close()

    try:
        await through("write", "INSERT INTO part_w VALUES (1, 1)", 30)
        await through("read_short", "SELECT COUNT(*) FROM part_w", 10)
        await through("read_long", "SELECT COUNT(*) FROM part_w", 30)
    finally:
        proxy.stop()
    print(f"commands in flight through partitions on {server.flavor} (buffer window 15 s): {outcomes}")
    with setup.cursor() as cur:
        cur.execute("SELECT COUNT(*) FROM part_w")
        count = cur.fetchone()[0]
    setup.close()
    assert outcomes["write"][:2] == ("error", 1158) and outcomes["write"][2] <= NOTICE_BOUND, outcomes
    assert count == 0, "an INSERT the client was told failed ran later"
    assert outcomes["read_short"][:2] == ("ok", ((0,),)) and outcomes["read_short"][2] <= 10 + 3, outcomes
    assert outcomes["read_long"][0] == "error" and 15 <= outcomes["read_long"][2] <= 15 + 5 + 2, outcomes


async def test_a_server_that_stops_reading_mid_command(db_factory, tmp_path):
    """A 25 MiB INSERT (five rows of 5 MiB: TiDB takes at most 6 MiB a row) sent to a hung
    server (SIGSTOP: its kernel takes a few MiB, then the send blocks): the command never
    reached the server whole, so it never ran. The proxy cuts
    the connection once the address is found dead, waits for the server within the buffer
    window, and sends it again: the client gets OK and the row is there once."""
    server = db_factory()
    setup = pymysql.connect(host="127.0.0.1", port=server.port, user="app", password="apppw", database="test", autocommit=True)
    with setup.cursor() as cur:
        cur.execute("DROP TABLE IF EXISTS big_w")
        cur.execute("CREATE TABLE big_w (id INT PRIMARY KEY, v LONGTEXT)")
    proxy = start_proxy(tmp_path, server, buffer_window="40s")
    value = "y" * (5 * 1024 * 1024)
    try:
        conn = connect(proxy.port)
        with conn.cursor() as cur:
            cur.execute("SELECT 1")  # logged in before the hang
        outcome: list = []

        def insert() -> None:
            t0 = time.monotonic()
            try:
                with conn.cursor() as cur:
                    cur.execute("INSERT INTO big_w VALUES (1, %s), (2, %s), (3, %s), (4, %s), (5, %s)", (value,) * 5)
                outcome.append(("ok", round(time.monotonic() - t0, 1)))
            except pymysql.err.MySQLError as exc:
                outcome.append(("error", exc.args, round(time.monotonic() - t0, 1)))

        started = time.time()
        async with trio.open_nursery() as nursery:
            with Hung(server):
                nursery.start_soon(trio.to_thread.run_sync, insert)
                await trio.sleep(HUNG_FOR)
        conn.close()
    finally:
        log = proxy.stop()
    with setup.cursor() as cur:
        cur.execute("SELECT COUNT(*), SUM(LENGTH(v)) FROM big_w")
        count, length = cur.fetchone()
    setup.close()
    notice = noticed_after([started], log)
    print(f"{server.flavor}: a 25 MiB INSERT into a hung server: {outcome}; noticed after {notice} s; rows {count}")
    assert outcome and outcome[0][0] == "ok", outcome
    assert (count, length) == (5, 5 * len(value))
    assert notice[0] <= NOTICE_BOUND, notice


async def test_a_server_that_accepts_and_never_greets_is_passed_over(db_factory, tmp_path):
    """Two addresses, the first a port that accepts and never sends a byte: the first login
    goes on to the second after connect_timeout (5 s), the health check marks the first down,
    and the next login does not wait for it at all."""
    server = db_factory()
    with SilentListener() as silent:
        proxy = ProxyProcess(tmp_path / "proxy", [silent.port, server.port], backend=backend_keys(server), log={"level": "info"})
        proxy.start()
        try:
            t0 = time.monotonic()
            first = connect(proxy.port)
            first_login = time.monotonic() - t0
            await trio.sleep(4 * HEALTH_INTERVAL + 2)  # a check or two of the silent address
            t0 = time.monotonic()
            second = connect(proxy.port)
            second_login = time.monotonic() - t0
            for conn in (first, second):
                with conn.cursor() as cur:
                    cur.execute("SELECT 1")
                conn.close()
        finally:
            log = proxy.stop()
    print(f"{server.flavor}: logins through a silent first address took {first_login:.2f} s, then {second_login:.2f} s; "
          f"{silent.accepted} connections accepted by it")  # fmt: skip
    assert first_login <= 5 + 2, first_login
    assert second_login < 1.0, second_login
    assert f"backend 127.0.0.1:{silent.port} is down" in log


async def test_a_server_that_answers_a_byte_a_second_is_passed_over(db_factory, tmp_path):
    """Two addresses of one server, the first through a relay that, from a moment on, passes
    the server's bytes at one a second. Its health checks get no whole greeting within their
    timeout (silent), so after dead_after its connections are cut: the idle session reconnects
    on the second address with its variable, the read that was in flight there is answered
    right or fails as a lost connection, and a new login takes well under a second."""
    server = db_factory()
    with Trickle(server.port) as trickle:
        proxy = ProxyProcess(tmp_path / "proxy", [trickle.port, server.port], backend=backend_keys(server), log={"level": "info"})
        proxy.start()
        try:
            idle, busy = connect(proxy.port), connect(proxy.port)
            with idle.cursor() as cur:
                cur.execute("SET @kept = 42")
            started, t0 = time.time(), time.monotonic()
            trickle.slow = True

            def read() -> tuple:
                t = time.monotonic()
                try:
                    with busy.cursor() as cur:
                        cur.execute("SELECT 6 * 7")
                        return ("ok", cur.fetchall(), round(time.monotonic() - t, 1))
                except pymysql.err.MySQLError as exc:
                    return ("error", exc.args[0], round(time.monotonic() - t, 1))

            in_flight = await trio.to_thread.run_sync(read)
            while f"127.0.0.1:{trickle.port} unreachable" not in proxy.log_text() and time.monotonic() - t0 < 3 * NOTICE_BOUND:
                await trio.sleep(0.5)
            t1 = time.monotonic()
            with idle.cursor() as cur:
                cur.execute("SELECT @kept")
                kept = cur.fetchone()[0]
            idle_next = time.monotonic() - t1
            t1 = time.monotonic()
            fresh = connect(proxy.port)
            with fresh.cursor() as cur:
                cur.execute("SELECT 1")
            login = time.monotonic() - t1
            for conn in (idle, busy, fresh):
                conn.close()
        finally:
            log = proxy.stop()
    notice = noticed_after([started], log)
    print(f"{server.flavor}: a server answering a byte a second: noticed after {notice} s; the read in flight: {in_flight}; "
          f"the idle session's next command {idle_next:.2f} s, @kept={kept}; a new login {login:.2f} s")  # fmt: skip
    assert notice[0] <= NOTICE_BOUND, notice
    assert in_flight[:2] == ("ok", ((42,),)) or in_flight[1] in (2006, 2013, 1158), in_flight
    assert in_flight[2] <= NOTICE_BOUND + 2, in_flight
    assert kept == 42 and idle_next < 1.0, (kept, idle_next)
    assert login < 1.0, login

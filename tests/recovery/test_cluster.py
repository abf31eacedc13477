"""Recovery across the servers of a TiDB cluster: an in-doubt COMMIT resolved on *another*
tidb-server than the one that ran it (the session failed over), with the data checked exactly.

    client -> proxy -> [fault shim -> tidb-server A, tidb-server B]   (one PD, one store)

The session starts on A through the shim. Its COMMIT's fate is made uncertain while A may
still be alive, then the shim "crashes" (every connection cut, connects refused), so the proxy
fails over to B. On a single server the proxy proves the old connection dead before it reads
the commit marker; across servers nothing can prove that, and the marker row is fenced instead
(proxy/recovery/markers.py): locked, read, and written in a transaction of B's, so that A's COMMIT, if
it has not written the row yet, can never commit after. Each case fails on the code before the
fence (1158: "its commit marker could not be checked"), and the frozen-server case would write
the row twice with a plain read of the marker.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pymysql
import pytest

from tests.lab.cluster import Cluster
from tests.lab.faultshim import FaultShim
from tests.lab.fixtures import APP_PASSWORD, APP_USER, running_cluster
from tests.lab.proxy import ProxyProcess

pytestmark = pytest.mark.integration

MARKERS = "replay_proxy.commit_markers"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    with running_cluster(tmp_path_factory.mktemp("cluster"), servers=2) as cluster:
        yield cluster


@pytest.fixture
def failover(cluster: Cluster, tmp_path) -> Iterator[tuple[Cluster, FaultShim, ProxyProcess]]:
    """A shim in front of A (stopped by the case: A "crashes" for the proxy) and a proxy in
    front of [shim, B] with commit markers."""
    a, b = cluster.servers
    if not a.is_running():
        a.start()
    shim = FaultShim(a.port).start()
    proxy = None
    try:
        proxy = ProxyProcess(
            tmp_path / "proxy",
            [shim.port, b.port],
            users=[{"name": APP_USER, "password": APP_PASSWORD}],
            recovery={"commit_marker": True, "buffer_window": "40s"},
            backend={"health_interval": "0s", "io_timeout": "40s"},
            log={"level": "info"},
        ).start()
        yield cluster, shim, proxy
    finally:
        try:
            if proxy is not None:
                proxy.stop()
        finally:
            shim.stop()
            if a.is_running():
                a.resume()  # a case that froze A and failed before waking it


def _client(proxy: ProxyProcess) -> pymysql.Connection:
    conn = pymysql.connect(host="127.0.0.1", port=proxy.port, user=APP_USER, password=APP_PASSWORD, database="test",
                           autocommit=True, read_timeout=90)  # fmt: skip
    with conn.cursor() as cur:
        cur.execute("SET SESSION tidb_txn_mode = 'optimistic'")  # DM's session
        cur.execute("SELECT @@port")
        port = cur.fetchone()[0]
    return conn, port


def _commit_in_thread(conn: pymysql.Connection) -> tuple[threading.Thread, list]:
    answer: list = []

    def commit() -> None:
        try:
            with conn.cursor() as cur:
                cur.execute("COMMIT")
            answer.append(None)
        except pymysql.err.MySQLError as exc:
            answer.append(exc.args[0])

    thread = threading.Thread(target=commit, daemon=True)
    thread.start()
    return thread, answer


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_commit_that_landed_on_the_lost_server_is_answered_ok_from_another(failover):
    cluster, shim, proxy = failover
    a, b = cluster.servers
    cluster.query("CREATE TABLE IF NOT EXISTS test.landed (id INT PRIMARY KEY, v INT)")
    conn, port = _client(proxy)
    assert port == a.port  # the session is on A, through the shim
    with conn.cursor() as cur:
        cur.execute("BEGIN")
        cur.execute("INSERT INTO landed VALUES (1, 10)")
    rule = shim.stall(None, match="COMMIT")  # A commits; its answer is held
    thread, answer = _commit_in_thread(conn)
    _wait(lambda: rule.matched, 10, "the COMMIT at the shim")
    time.sleep(0.5)  # A has committed by now
    shim.stop()  # every connection cut, connects refused: the proxy fails over to B
    thread.join(60)
    assert answer == [None], (answer, proxy.log_text()[-3000:])  # the marker, read on B: it committed
    assert cluster.query("SELECT id, v FROM test.landed") == [(1, 10)]
    with conn.cursor() as cur:
        cur.execute("SELECT @@port")
        assert cur.fetchone()[0] == b.port
    conn.close()
    assert "commit marker" in proxy.log_text() and "says the COMMIT committed" in proxy.log_text()


def test_a_commit_held_by_a_frozen_server_can_never_land_after_the_answer(failover):
    """A receives the COMMIT but is frozen (SIGSTOP) before it runs it: to the proxy, on B, it
    did not commit. Then A wakes up and runs the COMMIT. The fence makes it fail; a plain read
    of the marker would let it commit, and the client's retry would write the row a second time
    (AUTO_INCREMENT: A and B hand out ids from different ranges, so nothing else conflicts)."""
    cluster, shim, proxy = failover
    a, b = cluster.servers
    cluster.query("CREATE TABLE IF NOT EXISTS test.frozen (id BIGINT AUTO_INCREMENT PRIMARY KEY, v INT)")
    conn, port = _client(proxy)
    assert port == a.port
    with conn.cursor() as cur:
        cur.execute("BEGIN")
        cur.execute("INSERT INTO frozen (v) VALUES (7)")
    marker = shim.stall(None, match=f"INSERT INTO {MARKERS}")  # the proxy's marker upsert, before COMMIT
    thread, answer = _commit_in_thread(conn)
    _wait(lambda: marker.matched, 10, "the marker upsert at the shim")
    time.sleep(0.3)  # A has run the upsert (in its transaction) and answered; the shim holds it
    a.pause()  # SIGSTOP
    try:
        shim.release()  # the proxy gets the upsert's OK and sends COMMIT, which A cannot run now
        _wait(lambda: shim.count("COMMIT") >= 1, 10, "the COMMIT at the shim")
        shim.stop()  # the proxy fails over to B
        thread.join(60)
        assert answer in ([None], [1213]), (answer, proxy.log_text()[-3000:])
        assert "says the COMMIT did not commit" in proxy.log_text()
    finally:
        a.resume()  # A runs the COMMIT now
    time.sleep(3)
    if answer == [1213]:  # not replayed (B gave another id): the client retries, as DM does
        with conn.cursor() as cur:
            cur.execute("BEGIN")
            cur.execute("INSERT INTO frozen (v) VALUES (7)")
            cur.execute("COMMIT")
    time.sleep(1)
    assert cluster.servers[1].query("SELECT COUNT(*) FROM test.frozen WHERE v = 7") == [(1,)]
    conn.close()

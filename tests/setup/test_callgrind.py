"""bench/callgrind.py counts exactly the work between a zero and a dump (``bench.run
--instructions``): a process that does twice the work between its marks counts twice the
instructions, and the same work counts the same however often it is repeated. The process is
a tiny Python loop under callgrind; it waits between steps, as a proxy does between runs."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bench.callgrind import Callgrind, callgrind_unavailable_reason, instructions

pytestmark = pytest.mark.skipif(callgrind_unavailable_reason() is not None, reason=str(callgrind_unavailable_reason()))

WORKER = """
import sys
for line in sys.stdin:  # blocks in read(2) between steps, like a middle in epoll_wait between runs
    total = 0
    for i in range(int(line)):
        total += i * i
    print("done", flush=True)
"""


def test_a_count_covers_exactly_the_work_between_the_marks(tmp_path):
    cg = Callgrind(tmp_path, "worker")
    proc = subprocess.Popen(cg.command([sys.executable, "-c", WORKER]), env=cg.environment({}), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)  # fmt: skip
    cg.attach(proc.pid)
    assert proc.stdin is not None and proc.stdout is not None

    def counted(n: int) -> int:
        cg.zero()
        proc.stdin.write(f"{n}\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == "done\n"
        return instructions(cg.dump())

    try:
        proc.stdin.write("1000\n")  # warm-up, and the library is loaded once the answer comes
        proc.stdin.flush()
        assert proc.stdout.readline() == "done\n"
        once, twice, again = counted(20_000), counted(40_000), counted(20_000)
    finally:
        proc.stdin.close()
        proc.wait(120)
    assert 1.9 < twice / once < 2.1, (once, twice)
    assert abs(again - once) / once < 0.01, (once, again)  # the same work, the same count

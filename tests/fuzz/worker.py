"""One long-mode run of one target under atheris (a subprocess of ``python -m tests.fuzz --long``).

    python -m tests.fuzz.worker TARGET RUNS OUTDIR

libFuzzer exits the process when it is done (or on a timeout / out-of-memory), so the report
is written every few thousand inputs and at the end; the driver reads it back.
"""

from __future__ import annotations

import resource
import sys
import time
from pathlib import Path

SAVE_EVERY = 20_000
ADDRESS_SPACE = 4 << 30  # a length field that makes something allocate it fails with MemoryError


def main() -> None:
    name, runs, out = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    extra = sys.argv[4:]
    import atheris

    with atheris.instrument_imports(include=["proxy"]):
        from tests.fuzz import targets
    from tests.fuzz.runner import Recorder, Report

    target = targets.TARGETS[name]
    corpus = out / f"corpus-{name}"
    corpus.mkdir(parents=True, exist_ok=True)
    for n, seed in enumerate(target.seeds()):
        (corpus / f"seed-{n}").write_bytes(seed)
    report = Report(name, engine="atheris")
    recorder = Recorder(report, out / "crashes")
    summary = out / f"report-{name}.json"
    t0 = time.perf_counter()
    run = target.run

    def one_input(data: bytes) -> None:
        recorder.run(run, data)
        if report.inputs % SAVE_EVERY == 0 or report.inputs >= runs:
            report.seconds = time.perf_counter() - t0
            recorder.save(summary)

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, hard))
    atheris.Setup(
        [sys.argv[0], f"-runs={runs}", "-max_len=4096", "-timeout=20", "-rss_limit_mb=2048",
         "-print_final_stats=1", *extra, str(corpus)],
        one_input,
    )  # fmt: skip
    atheris.Fuzz()


if __name__ == "__main__":
    main()

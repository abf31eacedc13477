# syntax=docker/dockerfile:1
#
# replay-proxy: one process per target database, its TOML config mounted at
# /etc/replay-proxy/proxy.toml (see configs/dm-sidecar.toml and configs/deploy/kubernetes/).
#
#   docker build -t replay-proxy:0.1.0 .
#   docker run --rm -v "$PWD/configs/dm-sidecar.toml:/etc/replay-proxy/proxy.toml:ro" \
#       -e DM_TARGET_PASSWORD -e REPLAY_PROXY_ADMIN_TOKEN --stop-timeout 40 replay-proxy:0.1.0
#
# Notes:
# - listen.address 127.0.0.1:4000 is reachable only from the same network namespace (a
#   Kubernetes pod, `docker run --network container:<dm-worker>`); to publish the port
#   (-p 4000:4000) listen on 0.0.0.0:4000.
# - SIGTERM drains: sessions close between transactions, the rest after listen.drain_timeout.
#   Docker's default stop timeout is 10 s: give `docker stop -t` / --stop-timeout more than
#   drain_timeout (+10 s with listen.workers > 1).
# - The root filesystem may be read-only (--read-only) if /tmp is writable (--tmpfs /tmp):
#   commands bigger than limits.spool_threshold are spooled to a temporary file.
# - Kubernetes ignores HEALTHCHECK; the manifests use httpGet probes on /healthz and /readyz.

# The wheel is built where a C compiler is: its sans-IO core compiled by mypyc (setup.py). The
# slim image has none, and a build there would install the interpreted core (it works, at about
# twice the CPU per statement: docs/benchmarks.md).
FROM python:3.11 AS build
RUN --mount=type=bind,source=.,target=/src,rw \
    pip wheel --no-cache-dir --no-deps -c /src/constraints.txt /src -w /wheels

FROM python:3.11-slim

# REPLAY_PROXY_HEALTH_URL: what HEALTHCHECK asks. The admin endpoint defaults to
# 127.0.0.1:<listen port + 10000> (14000 for 4000); set it when the listen port or
# [admin] address differ (an admin address of 0.0.0.0:P is reached as 127.0.0.1:P).
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    REPLAY_PROXY_HEALTH_URL=http://127.0.0.1:14000/healthz

# The package alone (no test extras), the wheel built above, at the versions of constraints.txt
# (what the tests ran with). The checkout and the wheel are bind-mounted for this step only: they
# never become layers of the image.
RUN --mount=type=bind,source=constraints.txt,target=/src/constraints.txt \
    --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir -c /src/constraints.txt /wheels/*.whl \
    && python -c "import proxy.corebuild as c; m = c.mode(); print('sans-IO core:', m); assert m.startswith('compiled'), m" \
    && groupadd --system --gid 10001 replay-proxy \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin replay-proxy \
    && mkdir -p /etc/replay-proxy

# Numeric, so Kubernetes' runAsNonRoot can check it.
USER 10001:10001

# 4000: the MySQL protocol (listen.address); 14000: the admin endpoint (/healthz, /readyz,
# /metrics, /status).
EXPOSE 4000 14000

HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(os.environ['REPLAY_PROXY_HEALTH_URL'], timeout=4)"]

STOPSIGNAL SIGTERM
ENTRYPOINT ["replay-proxy"]
CMD ["--config", "/etc/replay-proxy/proxy.toml"]

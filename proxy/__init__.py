"""replay-proxy. Which build of the sans-IO core runs (compiled or interpreted) is chosen here,
before any of it is imported (``proxy.corebuild``)."""

from proxy import corebuild

corebuild.choose()

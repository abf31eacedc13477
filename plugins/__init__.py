"""Built-in plugins, one module each, named in a target's ``[plugins] chain``:

- ``metrics``: Prometheus metrics on the admin endpoint (``/metrics``).
- ``query_log``: JSON lines of statements, literals redacted, sampled, slow ones always.
- ``rewrite``: ordered regex rewrite rules (e.g. INSERT INTO → REPLACE INTO for listed tables).
- ``firewall``: allow / deny statements by class or pattern, answered with ERR 1142.
- ``throttle``: statements per second per target, queueing up to a bound, then ERR 1226.

Each module's ``Plugin`` class documents its options; configs/plugins.toml shows them all.
"""

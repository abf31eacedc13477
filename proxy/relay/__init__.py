"""One client session, split by concern:

- ``tasks``: the ``Session``, its client task and sending commands (submit, send);
- ``responses``: its backend task (stream each response, complete it, notice a closing server);
- ``inflight``: the command in flight and the exceptions that end a session;
- ``login``: greeting, authentication, backend login, COM_CHANGE_USER;
- ``oversize``: commands over max_allowed_packet (refuse with 1153, or split);
- ``reconnect``: recovery (decide, reconnect, restore, replay), moves off a draining backend;
- ``kills``: an operator's KILL told from a server going away; the proxy's own KILLs;
- ``proofs``: what information_schema proves: a table's keys (safe mode, LAST_INSERT_ID after
  a reconnect), the views a statement reads (stored code hidden in them).

What the session's state is (transaction, journal, variables, prepared statements) is kept by
``proxy.tracking.SessionTracker``. Below the relay: ``proxy.markers`` (commit markers that
resolve an in-doubt COMMIT), ``proxy.tablekeys`` (safe mode's table keys, cached per target),
``proxy.worker_identity`` (this worker's session ids, asking a peer worker).
"""

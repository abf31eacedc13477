"""One client session, split by concern:

- ``tasks``: the ``Session``, its two tasks and the per-packet code (submit, send, stream);
- ``inflight``: the command in flight and the exceptions that end a session;
- ``login``: greeting, authentication, backend login, COM_CHANGE_USER;
- ``oversize``: commands over max_allowed_packet (refuse with 1153, or split);
- ``reconnect``: recovery (decide, reconnect, restore, replay);
- ``markers``: commit markers that resolve an in-doubt COMMIT.

What the session's state is (transaction, journal, variables, prepared statements) is kept by
``proxy.tracking.SessionTracker``.
"""

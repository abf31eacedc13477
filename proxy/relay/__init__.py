"""One client session, split by concern:

- ``tasks``: the ``Session`` (the client task's state), its client task and sending commands;
- ``relay``: ``Relay``, the session as the modules below take it (a Protocol ``Session``
  fulfils: they do not import ``tasks``), and ``FirstAnswer``;
- ``link``: the backend connection's life as a state machine (``BackendLink``: up, lost,
  moving, swapping, closed, each move checked against ``TRANSITIONS``; ``replace(new)`` for
  the login, COM_CHANGE_USER, recovery and moves);
- ``responses``: the backend task (stream each response, complete it, notice a closing
  server) and ``on_lost``, which runs recovery's steps and answers the client;
- ``inflight``: the command in flight and the exceptions that end a session;
- ``answers``: what the client's next command gets first (one slot: a lost transaction's
  1213, a connection error, a split statement's warnings);
- ``login``: greeting, authentication, backend login, COM_CHANGE_USER;
- ``oversize``: commands over max_allowed_packet (refuse with 1153, or split);

Recovery's steps and proofs are in ``proxy.recovery``; the session model in ``proxy.session``.

"Session" names four things, each of its own: ``relay.tasks.Session``, one client's relay;
``proxy.session.tracker.SessionTracker``, what the server's side of it looks like (transaction,
journal, prepared statements: the only writer of that state); ``proxy.session.state``, the
part a new backend connection is given again (``SessionState``, ``PreparedStatement``);
``proxy.session.info.SessionInfo``, the read-only view plugins get. Below the relay:
``proxy.recovery.markers`` (commit markers that resolve an in-doubt COMMIT), ``proxy.recovery.tablekeys``
(safe mode's table keys, cached per target), ``proxy.worker_identity`` (this worker's session
ids, asking a peer worker).
"""

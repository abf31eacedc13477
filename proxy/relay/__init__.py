"""One client session's I/O, in two lanes. The command's life is the sans-IO cycle's
(``proxy.cycle.CommandCycle``); the relay moves its bytes:

- the fast lane (``fastlane``): while the session's tasks wait, the host loop's callbacks
  (``proxy.hostloop``: uvloop, with trio its guest) carry each command the cycle takes as it is
  to the server and its answer back, waking no task;
- the slow lane: the session's two trio tasks, for everything that waits -- the client task
  (``commands``: read a command, let the plugins look at it, judge it, send it; the proxy's own
  answers) and the backend task (``backendtask``, with ``responses``: stream an answer,
  complete it; a lost connection to recovery).

The other modules: ``session`` (the ``Session``: its parts, its tasks, what the rest of the
proxy asks of it), ``link`` (the backend connection's life as a state machine, each move
checked against ``TRANSITIONS``), ``reading`` (a command split over reads, spooled), ``record``
(where a command stands, for whoever may take the session over), ``parts`` (what a session is
made of, and the ``Recovery`` it asks: recovery sits above the relay and is handed in),
``login`` (greeting, authentication, backend login, COM_CHANGE_USER), ``oversize`` (commands
over max_allowed_packet: 1153, or split), ``kill`` (a client's KILL of a proxy session),
``verdicts`` (the plugins' command chain carried out), ``relay`` (the ``Relay`` protocol the
modules take instead of importing the Session: no circle of imports).

"Session" names four things, each of its own: ``relay.session.Session``, one client's relay;
``proxy.session.tracker.SessionTracker``, what the server's side of it looks like (transaction,
journal, prepared statements: the only writer of that state); ``proxy.session.state``, the
part a new backend connection is given again (``SessionState``, ``PreparedStatement``);
``proxy.session.info.SessionInfo``, the read-only view plugins get.
"""

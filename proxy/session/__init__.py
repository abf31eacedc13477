"""The session model, sans-IO: what one client session looks like on the server's side.

- ``tracker``: ``SessionTracker``, the only writer of a session's state: it reads each command
  and its response (sent, completed) and keeps the transaction, the session state and the
  prepared statements in step with the server's;
- ``prepared``: ``PreparedStatements``, the tracker's part for prepared statements (their ids on
  the backend connection, their long data, commands rewritten for a new connection);
- ``completed``: what a completed command carries (``Completed``) and what its kind alone says;
- ``insertid``: LAST_INSERT_ID() followed through the commands that complete;
- ``transaction``: the open transaction and its journal (what a replay runs again);
- ``state``: the part a new backend connection is given again (``SessionState``,
  ``PreparedStatement``);
- ``longdata``: COM_STMT_SEND_LONG_DATA kept for a re-prepare, spooled to disk when large;
- ``intake``: reading one client command (limits, spooling of large ones);
- ``info``: ``SessionInfo``, the read-only view plugins and log lines get.

Nothing here touches a socket, except ``intake`` reading the client's bytes.
"""

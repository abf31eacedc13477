"""Hand-over between the running proxy and a new process of it (an upgrade: the code and the
config now on disk, started by the running one).

- ``protocol``: the frame format (sans-IO): a versioned JSON header, an optional binary
  payload, and a count of the file descriptors that travel with the frame;
- ``fdpass``: the channel itself, a Unix stream socket carrying those frames, the descriptors
  passed by SCM_RIGHTS; trio waits, each with a timeout;
- ``sdnotify``: the datagram systemd's ``Type=notify`` expects (``READY=1``, ``MAINPID=``);
- ``upgrade``: the two sides of an upgrade: the old process starts the new one and hands it
  its listening sockets, the new one adopts them instead of binding and says when it serves;
- ``sessions``: then the live sessions, each at a command boundary with its client and backend
  connections and what the proxy knows of it; the ones that cannot move drain.
"""

"""Recovery: the backend connection of a session is gone; what may the proxy do, and doing it.

- ``driver``: ``recover(loss, slots)``, the one way in: it runs the steps and comes back with
  a decision for the relay (resumed, answer now, answer the next command, fatal);
- ``moves``: what the driver does after each step, from what the step found (pure);
- ``plan``: the decision table (``plan_recovery``, pure: GUIDE §4's rules);
- ``facts``: what the table needs to know about one command (``StatementFacts``), computed
  once and kept with it; the plugins' safe-mode answers, once per text per loss;
- ``loss``: one loss (``Loss``, what the steps read and find), the session's fixed parts
  (``SessionParts``), the outcomes that end it (1158, 1213);
- ``restore``: reconnect and restore the session; a move off a draining backend between
  transactions;
- ``replay``: a COMMIT in doubt resolved by its marker; what runs again proven, the journal
  replayed;
- ``proofs``: what information_schema proves (safe mode's table keys, views that call stored
  code, LAST_INSERT_ID after a reconnect);
- ``markers``: commit markers (an in-doubt COMMIT resolved exactly);
- ``tablekeys``: table keys cached per target;
- ``kills``: an operator's KILL told from a server going away; the proxy's own KILLs.
"""

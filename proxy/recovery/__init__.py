"""Recovery: the backend connection of a session is gone; what may the proxy do, and doing it.

- ``plan``: the decision table (``plan_recovery``, pure: GUIDE §4's rules);
- ``facts``: what the table needs to know about one command (``StatementFacts``);
- ``steps``: the steps, each reading a ``Loss``: decide, reestablish (reconnect and restore),
  resolve a COMMIT in doubt by its marker, prove and replay, finish; a move off a draining
  backend between transactions;
- ``proofs``: what information_schema proves (safe mode's table keys, views that call stored
  code, LAST_INSERT_ID after a reconnect);
- ``markers``: commit markers (an in-doubt COMMIT resolved exactly);
- ``tablekeys``: table keys cached per target;
- ``kills``: an operator's KILL told from a server going away; the proxy's own KILLs.
"""

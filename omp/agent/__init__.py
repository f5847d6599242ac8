"""The agent loop: turns, tool execution, steering and follow-up queues, and the ledger that
closes what an abort left open."""

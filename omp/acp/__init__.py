"""ACP mode (``omp acp``): the Agent Client Protocol for editors, over the sessions of
``omp --mode rpc``. Imported only when ``omp acp`` runs (``omp.cli``), so ``--mode rpc``'s
start-up never pays for it.

* ``omp.acp.wire``: the protocol's messages as msgspec Structs (no I/O);
* ``omp.acp.updates``: session events → ``session/update`` (no I/O);
* ``omp.acp.server``: the requests, the sessions, ``session/cancel``;
* ``omp.acp.main``: the process (``serve_acp`` on any streams, ``run_acp`` on stdio).
"""

"""ACP mode (``omp acp``): the Agent Client Protocol for editors, over the sessions of
``omp --mode rpc``. Imported only when ``omp acp`` runs (``omp.cli``), so ``--mode rpc``'s
start-up never pays for it.

* ``omp.acp.wire``: the protocol's messages as msgspec Structs (no I/O);
* ``omp.acp.updates``: session events → ``session/update`` (no I/O);
* ``omp.acp.views``: sessions as the wire shows them (history, listings, options, stop reasons);
* ``omp.acp.client``: requests of ours to the editor (permission, ``fs/*``, ``terminal/*``);
* ``omp.acp.session``: one session (its prompt, its events, its approvals, its cancel);
* ``omp.acp.server``: reading and answering requests, the session lifecycle methods;
* ``omp.acp.main``: the process (``serve_acp`` on any streams, ``run_acp`` on stdio).
"""

"""Testing helpers for hosts and for omp itself.

* ``omp.testing.fake_llm``: the fake LLM server (``open_fake_llm``, ``serve_fake_llm``, and
  ``python -m omp.testing.fake_llm --script FILE``);
* ``omp.testing.script``: its provider-neutral script format.

Nothing is imported here, so that ``python -m omp.testing.fake_llm`` runs the module once.
"""

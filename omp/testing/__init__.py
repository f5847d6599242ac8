"""Testing helpers for hosts and for omp itself.

* ``omp.testing.fake_llm``: the fake LLM server (``open_fake_llm``, ``serve_fake_llm``, and
  ``python -m omp.testing.fake_llm --script FILE``);
* ``omp.testing.script``: its provider-neutral script format;
* ``omp.testing.fake_oauth``: a fake OAuth 2.0 server (device code, PKCE, refresh, scripted
  denials, expiry and ``slow_down``) for login tests;
* ``omp.testing.fake_web``: pages (redirects, hanging downloads) and the Brave, Exa, Tavily and
  Kagi search APIs, for the web tools' tests;
* ``omp.testing.listen``: the listener and accept loop the three servers share.

Nothing is imported here, so that ``python -m omp.testing.fake_llm`` runs the module once.
"""

"""Testing helpers for hosts and for omp itself.

The kit for a host's tests (docs/guides/testing.md):

* ``check_protocol(frames, commands)``: the protocol's rules, raising ``AssertionError`` that
  names the first one broken (``omp.testing.invariants``, with the single rules);
* ``Transcript``: a connection recorded on the wire (``omp.testing.transcript``);
* ``disruptions()``: a Hypothesis strategy of disruptions, where and what
  (``omp.testing.strategies``; imports Hypothesis, an optional dependency), and
  ``run_disrupted(harness, script, disruption)`` that applies one (``omp.testing.disrupt``);
* ``OmpHarness``, ``open_omp_client``, ``open_omp_process``: a scripted runtime and its client
  (``omp.testing.harness``), which the pytest fixtures ``fake_llm``, ``omp_client`` and
  ``omp_process`` give (``omp.testing.pytest_plugin``, loaded by pytest on its own);
* ``omp.testing.replies``: builders of the fake LLM's answers; ``omp.testing.leaks``: what a
  test left running.

The servers:

* ``omp.testing.fake_llm``: the fake LLM server (``open_fake_llm``, ``serve_fake_llm``, and
  ``python -m omp.testing.fake_llm --script FILE``);
* ``omp.testing.script``: its provider-neutral script format;
* ``omp.testing.fake_oauth``: a fake OAuth 2.0 server (device code, PKCE, refresh, scripted
  denials, expiry and ``slow_down``) for login tests;
* ``omp.testing.fake_web``: pages (redirects, hanging downloads) and the Brave, Exa, Tavily and
  Kagi search APIs, for the web tools' tests;
* ``omp.testing.listen``: the listener and accept loop the three servers share.

The names above are loaded on first use (PEP 562), nothing at import: so that
``python -m omp.testing.fake_llm`` runs the module once, and Hypothesis is imported only by
``disruptions``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .disrupt import Disruption as Disruption
    from .disrupt import run_disrupted as run_disrupted
    from .harness import OmpHarness as OmpHarness
    from .harness import open_omp_client as open_omp_client
    from .harness import open_omp_process as open_omp_process
    from .invariants import Stops as Stops
    from .invariants import check_protocol as check_protocol
    from .strategies import disruptions as disruptions
    from .transcript import Transcript as Transcript

__all__ = ["Disruption", "OmpHarness", "Stops", "Transcript", "check_protocol", "disruptions",
           "open_omp_client", "open_omp_process", "run_disrupted"]

_HOMES = {"check_protocol": ".invariants", "Stops": ".invariants", "Transcript": ".transcript",
          "Disruption": ".disrupt", "run_disrupted": ".disrupt", "disruptions": ".strategies",
          "OmpHarness": ".harness", "open_omp_client": ".harness",
          "open_omp_process": ".harness"}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'omp.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value  # once: later lookups do not come here
    return value

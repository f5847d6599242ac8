"""Hypothesis strategies of the testing kit. Importing this module imports Hypothesis (an
optional dependency: ``pip install hypothesis``); ``omp.testing`` loads it only when
``disruptions`` is asked for."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st

from .disrupt import ACTIONS, PHASES, Action, Disruption, Phase

__all__ = ["disruptions"]

DELAYS = (0.0, 0.0, 0.0, 0.005, 0.05)
"""Seconds into the phase: mostly at once (the server may be a step further than the host
saw), sometimes a little into it (a host answer is due, a backoff half over)."""


def disruptions(phases: Sequence[Phase] = PHASES, actions: Sequence[Action] = ACTIONS,
                *, max_nth: int = 2) -> st.SearchStrategy[Disruption]:
    """Disruptions of a run (``omp.testing.Disruption``) for ``run_disrupted``: where (one of
    ``phases``, its first to ``max_nth``-th occurrence, a drawn moment into it) and what (one
    of ``actions``). Shrinks towards the first phase and action given, at once."""
    if not phases or not actions:
        raise ValueError("disruptions() needs at least one phase and one action")
    unknown = sorted({*phases} - {*PHASES}) + sorted({*actions} - {*ACTIONS})
    if unknown:
        raise ValueError(f"disruptions(): unknown phases or actions {unknown}; "
                         f"phases are {list(PHASES)}, actions {list(ACTIONS)}")
    return st.builds(Disruption, phase=st.sampled_from(list(phases)),
                     action=st.sampled_from(list(actions)),
                     nth=st.integers(1, max(1, max_nth)), delay=st.sampled_from(DELAYS))

"""The session's one error type for the host (a module of its own so every layer can raise it)."""

from __future__ import annotations


class SessionError(Exception):
    """A request the session refuses; the message is meant for the host as it is."""


class InvalidRequest(SessionError):
    """A request whose parameters the session cannot take at all (answered with
    ``code: "invalid_params"``), as opposed to one refused in the present state."""

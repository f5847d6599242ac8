"""AgentSession: what a host steers (model, thinking, queue modes, todos; runs join later)."""

from .agent_session import AgentSession as AgentSession
from .agent_session import SessionError as SessionError
from .setup import create_session as create_session

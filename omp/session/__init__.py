"""AgentSession: the state a host steers (queue modes, todos); runs and files join it later."""

from .agent_session import AgentSession as AgentSession

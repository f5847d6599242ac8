"""The session a host steers: AgentSession (identity, file, model, prompts and their runs), the
run saga, the session file and its views, compaction, settings."""

from .agent_session import AgentSession as AgentSession
from .agent_session import SessionError as SessionError
from .setup import create_session as create_session

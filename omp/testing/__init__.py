"""Testing helpers for hosts and for omp itself: the fake LLM server and its script format."""

from .fake_llm import FakeLLM as FakeLLM
from .fake_llm import RecordedRequest as RecordedRequest
from .fake_llm import open_fake_llm as open_fake_llm
from .fake_llm import serve_fake_llm as serve_fake_llm
from .script import Reply as Reply
from .script import Script as Script
from .script import load_script as load_script

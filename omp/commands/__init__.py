"""Markdown the user writes to extend the agent: file commands, prompt templates and skills
(docs/design/extending.md#file-commands-and-templates, docs/design/extending.md#skills).
Discovery, the texts they become, and nothing else: the command registry, the dispatch of ``/…``
prompts and the frames live in ``omp.rpc``; this package imports nothing from ``omp.rpc`` or
``omp.session``.

**Trust.** Commands, templates and skills are text that becomes part of a prompt; nothing in
them is executed here, and they can do nothing the user's own prompt could not. So they load
from the project without ``--trust-project`` (unlike project extensions, which are code).

* ``frontmatter``: ``---`` YAML ``---`` headers, read through ``omp.config``'s YAML reader.
* ``templates``: ``/name args`` → argument parsing and ``$1``/``$@``/``$ARGUMENTS``/``$@[N:L]``
  substitution; ``render``: the Handlebars subset and the prompt formatter that follow.
* ``files``: ``commands/*.md`` (listed) and ``prompts/**/*.md`` (not listed).
* ``skills``: ``SKILL.md`` discovery, the system-prompt listing, the ``skill-prompt`` message.
* ``problems``: what was wrong in a file, as a value; loaders never raise for a file's sake.

Loaders read files synchronously: a handful of small files, read at startup, on session
changes and when the command list is rebuilt.
"""

from .files import INIT_DESCRIPTION as INIT_DESCRIPTION
from .files import FileCommand as FileCommand
from .files import PromptTemplate as PromptTemplate
from .files import expand_file_command as expand_file_command
from .files import expand_prompt_template as expand_prompt_template
from .files import find_file_command as find_file_command
from .files import find_prompt_template as find_prompt_template
from .files import load_file_commands as load_file_commands
from .files import load_prompt_templates as load_prompt_templates
from .frontmatter import Frontmatter as Frontmatter
from .frontmatter import parse_frontmatter as parse_frontmatter
from .frontmatter import strip_frontmatter as strip_frontmatter
from .problems import Problem as Problem
from .problems import ReportOnce as ReportOnce
from .problems import TemplateError as TemplateError
from .skills import SKILL_PROMPT_TYPE as SKILL_PROMPT_TYPE
from .skills import SKILL_URI_LINE as SKILL_URI_LINE
from .skills import Skill as Skill
from .skills import SkillInvocation as SkillInvocation
from .skills import SkillSettings as SkillSettings
from .skills import SkillUriError as SkillUriError
from .skills import find_skill as find_skill
from .skills import load_skills as load_skills
from .skills import parse_skill_invocation as parse_skill_invocation
from .skills import resolve_skill_uri as resolve_skill_uri
from .skills import skill_message as skill_message
from .skills import skills_prompt as skills_prompt
from .templates import expand as expand
from .templates import parse_args as parse_args
from .templates import split_command as split_command
from .templates import substitute_args as substitute_args
from .templates import uses_arg_placeholders as uses_arg_placeholders

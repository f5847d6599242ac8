"""Loading a Python file of the repository that is not in the package (``scripts/``, ``docs/``)
as a module, for the tests of that file."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def load_repo_file(relative: str) -> ModuleType:
    """``relative`` (from the repository root) imported as a module named after the file,
    registered in ``sys.modules`` (so its dataclass-like types resolve their own module)."""
    path = ROOT / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module

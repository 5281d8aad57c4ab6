"""`load_ref("package.module:attr")`: the one loader of users' code named in config (a workflow class, an
agent's entry function, a scorer, a tool). 'path/to/file.py:attr' loads a file; modules beside the working
directory are importable, as with uvicorn and gunicorn. Errors say what to fix and name the setting."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any


class RefError(ValueError):
    """A reference names nothing loadable; the message says why and what was tried."""


def import_module_of(mod_name: str, setting: str, error: type[Exception] = RefError) -> Any:
    """The module `mod_name` (a dotted name, or a .py path) for the setting `setting` (named in errors);
    failures raise `error` (a caller's own subclass of ValueError, e.g. WorkflowLoadError)."""
    if mod_name.endswith(".py") or "/" in mod_name:
        path = Path(mod_name)
        if not path.is_file():
            raise error(f"{setting}: file {path} does not exist")
        module_spec = importlib.util.spec_from_file_location(f"jetrl_user_{path.stem}", path)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        return module
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(mod_name)
    except ModuleNotFoundError as exc:
        if exc.name and mod_name.startswith(exc.name):
            raise error(f"{setting}: no module named {exc.name!r} (searched the working directory "
                           f"{os.getcwd()} and the installed packages; check the spelling or install the "
                           f"package)") from None
        raise error(f"{setting}: module {mod_name!r} failed to import: {exc}") from exc
    except Exception as exc:
        raise error(f"{setting}: importing {mod_name!r} raised {type(exc).__name__}: {exc}") from exc


def load_ref(ref: str, setting: str = "", error: type[Exception] = RefError) -> Any:
    """The object `ref` names: 'package.module:attr' (attr may be dotted, 'module:Class.method') or
    'path/to/file.py:attr'. `setting` (e.g. "rollout.workflow") prefixes every error; errors are `error`."""
    where = f"{setting}={ref!r}" if setting else repr(ref)
    mod_name, sep, attr = ref.rpartition(":")
    if not sep or not mod_name or not attr:
        raise error(f"{where}: write it as 'package.module:name'")
    module = import_module_of(mod_name, where, error)
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = sorted(n for n in dir(module) if not n.startswith("_"))
            raise error(f"{where}: {mod_name} has no attribute {attr!r} (it defines: "
                           f"{', '.join(names) or 'nothing'})")
        obj = getattr(obj, part)
    return obj

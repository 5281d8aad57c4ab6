"""reasoning-gym (https://github.com/open-thought/reasoning-gym, `pip install "reasoning-gym>=0.1.25"`): score a
completion with the task's own, unmodified `score_answer(answer, entry)`.

Reference (written by examples/reasoning_gym/data.py): `{"task": "leg_counting", "config": {"size": 200,
"seed": 0}, "entry": {"question": ..., "answer": ..., "metadata": {...}}}` -- the task name, the keyword
arguments the dataset was created with (`reasoning_gym.create_dataset(task, **config)`; `{}` = the task's
defaults, as `reasoning_gym.get_score_answer_fn` uses) and the full generated entry, so nothing is
regenerated to score. Some scorers read their dataset's config, which is why it is recorded.

Answer extraction (the prompt asks for `<answer>...</answer>`, reasoning-gym's own convention):
1. `tag`: the text inside the LAST `</answer>` and the `<answer>` before it, stripped;
2. `last_line`: else the last non-blank line of the completion, stripped (reasoning-gym's default scorer gives
   partial credit len(answer)/len(text) when the right answer is inside a longer text);
3. `none`: an empty completion -- `score_answer(None, entry)`.
The extracted text goes to `score_answer` unchanged. Metrics: `task:<name>` = 1.0 (which task) and
`format:<rule>` = 1.0.

Safety. The policy is an adversary, and several reasoning-gym scorers evaluate the model's answer as code:
`eval(answer)` (string_insertion, spiral_matrix, binary_matrix, n_queens, ...) or sympy's `sympify` /
`parse_expr`, which call `eval` too (the algebra tasks, ...). A completion could run arbitrary Python there,
and a time limit does not stop that. So before scoring a task, `unsafe_reason` reads the source of the module
that defines its `score_answer` and of the reasoning_gym modules it takes names from; a task whose scorer
source mentions eval/exec/compile, sympy, or `__import__` is refused (a Score error, reward 0), and the data
CLI refuses it up front. Tasks whose scoring is reasoning-gym's base rule (leg_counting, basic_arithmetic,
...) or plain string and number code pass. Scoring can still be slow on a hostile answer (string distance on
a huge text, ...), so the task runs in `process` mode: the engine's `reward.scorer_timeout_s` kills it.
"""

from __future__ import annotations

import inspect
import json
import re
import sys
from functools import lru_cache
from typing import Any

from reward_service.scorers import Score

OPEN, CLOSE = "<answer>", "</answer>"
INSTRUCTION = "Give your final answer inside <answer></answer> tags, for example <answer>42</answer>."

# Source text that means "this scorer may evaluate text as code" (literal_eval and re.compile excluded).
_CODE_RE = re.compile(r"(?<![\w.])(?:eval|exec|compile|__import__)\s*\(|\bsympy\b|\bsympify\b|\bparse_expr\b")
_SCALAR = (str, int, float, bool, type(None))


class BadReference(ValueError):
    pass


def extract_answer(completion: str) -> tuple[str | None, str]:
    """(the answer text, the rule that found it: tag | last_line | none). Linear time: two rfind calls and a
    reverse scan for the last line, whatever the completion holds."""
    end = completion.rfind(CLOSE)
    if end >= 0:
        start = completion.rfind(OPEN, 0, end)
        if start >= 0:
            return completion[start + len(OPEN):end].strip(), "tag"
    stripped = completion.rstrip()
    if not stripped:
        return None, "none"
    return stripped[stripped.rfind("\n") + 1:].strip(), "last_line"


def _rg():
    import reasoning_gym  # noqa: F401  (registers every dataset)
    from reasoning_gym.factory import DATASETS

    return DATASETS


def task_names() -> list[str]:
    return sorted(_rg())


@lru_cache(maxsize=512)
def unsafe_reason(task: str) -> str | None:
    """Why `task`'s scorer may run the model's answer as code (see the module docstring), or None if it is safe
    to score adversarial text with it. Raises KeyError for an unknown task."""
    cls = _rg()[task][0]
    fn = inspect.unwrap(cls.score_answer)
    module = sys.modules.get(getattr(fn, "__module__", ""), None)
    if module is None:
        return f"cannot find the source of {task}'s score_answer"
    mods = {module.__name__: module}
    for value in vars(module).values():  # helpers the scorer module takes from other reasoning_gym modules
        name = value.__name__ if inspect.ismodule(value) else getattr(value, "__module__", None)
        if isinstance(name, str) and name.split(".")[0] == "reasoning_gym" and name in sys.modules:
            mods.setdefault(name, sys.modules[name])
    for name, mod in mods.items():
        try:
            src = inspect.getsource(mod)
        except (OSError, TypeError):
            return f"cannot read the source of {name} to check {task}'s scorer"
        m = _CODE_RE.search(src)
        if m:
            return (f"reasoning-gym task {task!r} is not scored: its scorer module {name} uses {m.group(0).strip()!r}, "
                    "which can run a completion's text as code")
    return None


def _check_config(config: Any) -> dict:
    if not isinstance(config, dict) or not all(isinstance(k, str) for k in config):
        raise BadReference(f"reference 'config' must be an object of create_dataset keyword arguments, got {config!r:.100}")
    for k, v in config.items():
        items = v if isinstance(v, list) else [v]
        if not all(isinstance(x, _SCALAR) for x in items):
            raise BadReference(f"reference config {k!r} must be a scalar or a list of scalars")
    return config


@lru_cache(maxsize=64)
def _dataset(task: str, config_json: str):
    import reasoning_gym

    return reasoning_gym.create_dataset(task, **json.loads(config_json))


def parse_reference(reference: Any) -> tuple[str, dict, dict]:
    """(task, config, entry) of a reference; BadReference (a ValueError) saying what is wrong."""
    if isinstance(reference, str):
        try:
            reference = json.loads(reference)
        except ValueError:
            raise BadReference("reference is a string but not JSON; expected {task, config, entry}") from None
    if not isinstance(reference, dict):
        raise BadReference(f"reference must be an object {{task, config, entry}}, got {type(reference).__name__}")
    task, entry = reference.get("task"), reference.get("entry")
    if not isinstance(task, str) or not task:
        raise BadReference("reference has no 'task' (a reasoning-gym dataset name)")
    if not isinstance(entry, dict) or "answer" not in entry:
        raise BadReference("reference has no 'entry' object with an 'answer'")
    if not isinstance(entry.get("metadata", {}), dict):
        raise BadReference("reference entry 'metadata' must be an object")
    return task, _check_config(reference.get("config", {})), entry


def score(completion: str, reference: Any, payload: dict | None = None) -> Score:
    try:
        task, config, entry = parse_reference(reference)
    except BadReference as exc:
        return Score(0.0, {}, str(exc))
    try:
        registry = _rg()
    except ImportError as exc:
        return Score(0.0, {}, f"reasoning-gym is not installed ({exc}): pip install 'reasoning-gym>=0.1.25'")
    if task not in registry:
        return Score(0.0, {}, f"unknown reasoning-gym task {task!r} (reasoning-gym has {len(registry)} tasks)")
    why = unsafe_reason(task)
    if why:
        return Score(0.0, {f"task:{task}": 1.0}, why)
    try:
        dataset = _dataset(task, json.dumps(config, sort_keys=True))
    except Exception as exc:  # a bad config: the task's own validation message
        return Score(0.0, {f"task:{task}": 1.0}, f"cannot create reasoning-gym dataset {task!r} with config "
                     f"{config}: {type(exc).__name__}: {exc}"[:2000])
    answer, rule = extract_answer(completion)
    metrics = {f"task:{task}": 1.0, f"format:{rule}": 1.0}
    try:
        reward = dataset.score_answer(answer, entry)
    except Exception as exc:  # the task's scorer failed on this entry: an error, not a crash
        return Score(0.0, metrics, f"{task}.score_answer raised {type(exc).__name__}: {exc}"[:2000])
    if isinstance(reward, bool) or not isinstance(reward, (int, float)):
        return Score(0.0, metrics, f"{task}.score_answer returned {type(reward).__name__}, expected a number")
    return Score(float(reward), metrics)


def warmup() -> None:
    """Import reasoning-gym in each pool worker before it takes jobs (about a second)."""
    try:
        _rg()
    except ImportError:
        pass

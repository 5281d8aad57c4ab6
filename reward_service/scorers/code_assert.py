"""The host's half of an assert test: parse it, and decide it outside the sandbox.

A test string is parsed with `ast`. Top-level statements that are not `assert` are setup, run in the
sandbox. Each top-level `assert` is evaluated HERE: comparisons, `and`/`or`/`not` (short-circuit),
`x if c else y`, arithmetic (with size guards), literals and a few pure builtins (`len`, `sorted`, `abs`,
`round`, `min`, `max`, `sum`, `any`, `all`, `int`, `float`, `str`, `list`, `tuple`, `set`, `isinstance`,
`math.isclose`, ...) always mean the host's own. Any other subexpression (a name, a call of the
program's function, an attribute, a subscript, a comprehension) is a *leaf*: the sandbox evaluates it
and returns plain data, decoded strictly here (`decode`), in Python's order and only when needed. The
expected values written in the assert never enter the sandbox, and the verdict never leaves the host.

Refused at parse time (ValueError): a test with no top-level assert, an assert nested in another
statement, and a leaf with a comparison inside (e.g. `all(f(i) == i * i for i in range(9))`: the
comparison would be made by the program's objects; write `[f(i) for i in range(9)] == [0, 1, 4, ...]`).
A name bound by a setup statement is program state (a leaf): values the test must keep from the program
belong in the assert itself.
"""

from __future__ import annotations

import ast
import base64
import math
import operator
import re
from collections.abc import Callable
from typing import Any

MAX_SEQ = 1 << 20  # host-side sequence results (str/bytes/list * n, range)
MAX_INT_BITS = 1 << 16
_INT_RE = re.compile(r"-?\d{1,5000}")
_FLOAT_RE = re.compile(r"-?(\d+\.?\d*([eE][-+]?\d+)?|inf|nan)")


class TestFailed(Exception):
    """The assert is false, or evaluating it raised (on the host or in the sandbox)."""


class Abort(Exception):
    """Raised by a leaf callback to stop every test (the sandbox is gone): never turned into TestFailed."""


def _guarded_range(*args: Any) -> range:
    r = range(*args)
    if len(r) > MAX_SEQ:
        raise TestFailed(f"range of {len(r)} items is over the host's limit of {MAX_SEQ}")
    return r


def _sized(ctor: Callable) -> Callable:
    def make(*args: Any) -> Any:
        if args and isinstance(args[0], int) and not isinstance(args[0], bool) and abs(args[0]) > MAX_SEQ:
            raise TestFailed(f"{ctor.__name__}({args[0]}) is over the host's limit")
        return ctor(*args)

    return make


BUILTINS: dict[str, Callable] = {
    "len": len, "sorted": sorted, "abs": abs, "round": round, "min": min, "max": max, "sum": sum, "any": any,
    "all": all, "int": int, "float": float, "str": str, "bool": bool, "list": list, "tuple": tuple, "set": set,
    "frozenset": frozenset, "dict": dict, "bytes": _sized(bytes), "range": _guarded_range, "reversed": reversed,
    "divmod": divmod, "chr": chr, "ord": ord,
}
TYPES = {"int": int, "float": float, "str": str, "bool": bool, "list": list, "tuple": tuple, "set": set,
         "frozenset": frozenset, "dict": dict, "bytes": bytes, "type(None)": type(None)}
MATH = {name: getattr(math, name) for name in ("isclose", "isnan", "isinf", "isfinite", "sqrt", "floor", "ceil",
                                               "fabs", "factorial", "gcd", "comb", "perm", "log", "exp")}
MATH_CONSTS = {"pi": math.pi, "e": math.e, "inf": math.inf, "nan": math.nan, "tau": math.tau}
COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
           ast.Gt: operator.gt, ast.GtE: operator.ge, ast.In: lambda a, b: a in b,
           ast.NotIn: lambda a, b: a not in b, ast.Is: operator.is_, ast.IsNot: operator.is_not}
BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
          ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
          ast.LShift: operator.lshift, ast.RShift: operator.rshift, ast.BitAnd: operator.and_,
          ast.BitOr: operator.or_, ast.BitXor: operator.xor}
UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Invert: operator.invert, ast.Not: operator.not_}


def _is_type_arg(node: ast.expr) -> bool:
    if isinstance(node, ast.Tuple):
        return all(_is_type_arg(e) for e in node.elts)
    return ast.unparse(node) in TYPES


def _host_children(node: ast.expr) -> list[ast.expr] | None:
    """The subexpressions the host evaluates `node` from, or None when `node` is a leaf (the sandbox's)."""
    if isinstance(node, ast.Constant):
        return []
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return None if any(isinstance(e, ast.Starred) for e in node.elts) else list(node.elts)
    if isinstance(node, ast.Dict):
        return None if any(k is None for k in node.keys) else [*node.keys, *node.values]  # type: ignore[list-item]
    if isinstance(node, ast.UnaryOp):
        return [node.operand]
    if isinstance(node, ast.BinOp):
        return [node.left, node.right] if type(node.op) in BINOPS else None
    if isinstance(node, ast.BoolOp):
        return list(node.values)
    if isinstance(node, ast.Compare):
        return [node.left, *node.comparators]
    if isinstance(node, ast.IfExp):
        return [node.test, node.body, node.orelse]
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "math" \
            and node.attr in MATH_CONSTS:
        return []
    if isinstance(node, ast.Call) and not any(isinstance(a, ast.Starred) for a in node.args):
        kw_ok = all(k.arg is not None and isinstance(k.value, ast.Constant) for k in node.keywords)
        f = node.func
        if isinstance(f, ast.Name) and f.id == "isinstance" and len(node.args) == 2 and not node.keywords \
                and _is_type_arg(node.args[1]):
            return [node.args[0]]
        if kw_ok and isinstance(f, ast.Name) and f.id in BUILTINS:
            return list(node.args)
        if kw_ok and isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "math" \
                and f.attr in MATH:
            return list(node.args)
    return None


def _check(node: ast.expr, where: str) -> None:
    kids = _host_children(node)
    if kids is not None:
        for k in kids:
            _check(k, where)
        return
    for inner in ast.walk(node):
        if isinstance(inner, ast.Compare):
            raise ValueError(f"{where}: `{ast.unparse(node)}` makes a comparison inside a call, comprehension or "
                             "lambda, which the program under test would decide; compare whole values in the "
                             "assert itself (docs/reward.md, 'Code sandbox')")


def parse(test: str, where: str) -> list[tuple[str, Any]]:
    """A test string as steps: ("exec", source) run in the sandbox, ("assert", expr) decided here."""
    try:
        tree = ast.parse(test)
    except SyntaxError as exc:
        raise ValueError(f"{where} is not valid Python: {exc}") from None
    steps: list[tuple[str, Any]] = []
    for stmt in tree.body:
        if isinstance(stmt, ast.Assert):
            _check(stmt.test, where)
            steps.append(("assert", stmt.test))
        elif any(isinstance(n, ast.Assert) for n in ast.walk(stmt)):
            raise ValueError(f"{where}: an assert inside a `{type(stmt).__name__.lower()}` statement cannot be "
                             "checked by the scorer; write top-level asserts")
        else:
            steps.append(("exec", ast.unparse(stmt)))
    if not any(kind == "assert" for kind, _ in steps):
        raise ValueError(f"{where} has no top-level assert statement")
    return steps


def _binop(op: ast.operator, a: Any, b: Any) -> Any:
    seqs = (str, bytes, list, tuple)
    if isinstance(op, ast.Mult) and (isinstance(a, seqs) or isinstance(b, seqs)):
        seq, n = (a, b) if isinstance(a, seqs) else (b, a)
        if isinstance(n, int) and len(seq) * max(n, 0) > MAX_SEQ:
            raise TestFailed(f"sequence repeat of {len(seq)} x {n} is over the host's limit")
    if isinstance(a, int) and isinstance(b, int):
        if isinstance(op, ast.Pow) and b > 0 and abs(a) > 1 and a.bit_length() * b > MAX_INT_BITS:
            raise TestFailed("integer power over the host's size limit")
        if isinstance(op, ast.LShift) and b > MAX_INT_BITS:
            raise TestFailed("shift over the host's size limit")
    if isinstance(op, ast.Pow) and isinstance(b, (int, float)) and isinstance(a, complex):
        raise TestFailed("complex power is not evaluated by the host")
    return BINOPS[type(op)](a, b)


def evaluate(node: ast.expr, leaf: Callable[[str], Any]) -> Any:
    """The value of `node`, asking `leaf(source)` for the sandbox's subexpressions in Python's order."""
    kids = _host_children(node)
    if kids is None:
        return leaf(ast.unparse(node))
    try:
        return _evaluate(node, leaf)
    except (TestFailed, Abort):
        raise
    except Exception as exc:  # noqa: BLE001 - what Python would raise evaluating the assert
        raise TestFailed(f"{type(exc).__name__}: {exc}"[:300]) from None


def _evaluate(node: ast.expr, leaf: Callable[[str], Any]) -> Any:
    def ev(n: ast.expr) -> Any:
        return evaluate(n, leaf)

    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Tuple):
        return tuple(ev(e) for e in node.elts)
    if isinstance(node, ast.List):
        return [ev(e) for e in node.elts]
    if isinstance(node, ast.Set):
        return {ev(e) for e in node.elts}
    if isinstance(node, ast.Dict):
        return {ev(k): ev(v) for k, v in zip(node.keys, node.values, strict=True)}  # type: ignore[arg-type]
    if isinstance(node, ast.UnaryOp):
        return UNARY[type(node.op)](ev(node.operand))
    if isinstance(node, ast.BinOp):
        return _binop(node.op, ev(node.left), ev(node.right))
    if isinstance(node, ast.BoolOp):
        value = None
        for v in node.values:
            value = ev(v)
            if isinstance(node.op, ast.And) and not value or isinstance(node.op, ast.Or) and value:
                return value
        return value
    if isinstance(node, ast.Compare):
        left = ev(node.left)
        for op, comp in zip(node.ops, node.comparators, strict=True):
            right = ev(comp)
            if not COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.IfExp):
        return ev(node.body) if ev(node.test) else ev(node.orelse)
    if isinstance(node, ast.Attribute):
        return MATH_CONSTS[node.attr]
    assert isinstance(node, ast.Call)
    f = node.func
    if isinstance(f, ast.Name) and f.id == "isinstance":
        types = node.args[1]
        t = tuple(TYPES[ast.unparse(e)] for e in types.elts) if isinstance(types, ast.Tuple) else \
            TYPES[ast.unparse(types)]
        return isinstance(ev(node.args[0]), t)
    fn = BUILTINS[f.id] if isinstance(f, ast.Name) else MATH[f.attr]  # type: ignore[attr-defined]
    args = [ev(a) for a in node.args]
    kwargs = {k.arg: k.value.value for k in node.keywords}  # type: ignore[attr-defined]
    if fn is math.factorial and args and isinstance(args[0], int) and args[0] > 5000:
        raise TestFailed("factorial over the host's size limit")
    out = fn(*args, **kwargs)
    return list(out) if fn is reversed else out


def decode(v: Any, depth: int = 0) -> Any:
    """Tagged plain data from the sandbox as exact host types; anything else raises TestFailed."""
    if depth > 60:
        raise TestFailed("value from the program is nested too deep")
    if not isinstance(v, list) or not v or not isinstance(v[0], str):
        raise TestFailed("malformed value from the sandbox")
    tag, rest = v[0], v[1:]
    try:
        if tag == "N" and not rest:
            return None
        (p,) = rest
        if tag == "B" and isinstance(p, bool):
            return p
        if tag == "I" and isinstance(p, str) and _INT_RE.fullmatch(p):
            return int(p)
        if tag == "F" and isinstance(p, str) and _FLOAT_RE.fullmatch(p):
            return float(p)
        if tag == "S" and isinstance(p, str):
            return p
        if tag == "Y" and isinstance(p, str):
            return base64.b64decode(p, validate=True)
        if tag in ("L", "T", "E", "Z") and isinstance(p, list):
            items = [decode(x, depth + 1) for x in p]
            return {"L": list, "T": tuple, "E": set, "Z": frozenset}[tag](items)
        if tag == "D" and isinstance(p, list):
            out = {}
            for pair in p:
                if not isinstance(pair, list) or len(pair) != 2:
                    raise TestFailed("malformed dict from the sandbox")
                out[decode(pair[0], depth + 1)] = decode(pair[1], depth + 1)
            return out
    except (ValueError, TypeError) as exc:  # unhashable key / set item, bad base64
        raise TestFailed(f"malformed value from the sandbox: {exc}") from None
    raise TestFailed("malformed value from the sandbox")

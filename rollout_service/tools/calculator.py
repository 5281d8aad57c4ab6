"""calculator: evaluates an arithmetic expression safely (a whitelist over Python's AST, no eval)."""

from __future__ import annotations

import ast
import math
import operator

from rollout_service.tools.base import ToolError

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCS = {"sqrt": math.sqrt, "abs": abs, "round": round, "min": min, "max": max, "log": math.log,
          "exp": math.exp, "sin": math.sin, "cos": math.cos, "tan": math.tan, "floor": math.floor,
          "ceil": math.ceil}
_CONSTS = {"pi": math.pi, "e": math.e}
MAX_EXPONENT = 1000
MAX_MAGNITUDE = 1e100


def evaluate(expression: str) -> int | float:
    """Value of an arithmetic expression; ToolError naming what is not allowed otherwise."""
    if len(expression) > 500:
        raise ToolError(f"expression too long ({len(expression)} chars, at most 500)")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ToolError(f"cannot parse {expression!r}: {exc.msg}") from None
    return _eval(tree.body)


def _check(v):
    if isinstance(v, (int, float)) and not isinstance(v, bool) and abs(v) > MAX_MAGNITUDE:
        raise ToolError("result too large")
    return v


def _eval(node: ast.AST):
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.Name) and node.id in _CONSTS:
        return _CONSTS[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ToolError(f"exponent {right} too large (at most {MAX_EXPONENT})")
        try:
            return _check(_BINOPS[type(node.op)](left, right))
        except ZeroDivisionError:
            raise ToolError("division by zero") from None
        except OverflowError:
            raise ToolError("result too large") from None
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS and not node.keywords:
        try:
            return _check(_FUNCS[node.func.id](*[_eval(a) for a in node.args]))
        except (ValueError, TypeError, OverflowError) as exc:
            raise ToolError(f"{node.func.id}: {exc}") from None
    what = type(node).__name__ if not isinstance(node, ast.Name) else f"name {node.id!r}"
    raise ToolError(f"{what} is not allowed (numbers, + - * / // % **, ( ), {', '.join(_FUNCS)}, pi, e)")


class Calculator:
    name = "calculator"
    description = "Evaluate an arithmetic expression, e.g. (3 + 4) * 2 or sqrt(2)."
    parameters = {"type": "object", "properties": {"expression": {"type": "string",
                                                                  "description": "The expression."}},
                  "required": ["expression"]}

    async def run(self, args: dict) -> str:
        value = evaluate(str(args["expression"]))
        if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
            value = int(value)
        return str(value)

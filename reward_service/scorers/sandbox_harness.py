"""Runs inside the code sandbox (python -I -S -B sandbox_harness.py MODE): not imported by the service.

It decides nothing: the host (reward_service/scorers/code.py, code_assert.py) holds the expected values
and makes every comparison. Two modes:
- `io`: runs solution.py (copied into the work dir by bwrap) once with the real stdin/stdout; the host
  feeds the input and reads the output itself.
- `asserts`: a request/reply loop. Requests arrive one JSON line at a time on the original stdin;
  `load` runs the program's source, `exec` a setup statement, `eval` one expression of an assert that
  touches program state (a "leaf"), answered as plain data (None/bool/int/float/str/bytes/list/tuple/
  dict/set, tagged). Replies go out as `<seq> <json>` on a copy of the original stdout; the program's own
  fd 0 is /dev/null, its fd 1 is the stderr pipe, and sys.stdout a capped buffer. The program can reach
  all of this (same interpreter): whatever it writes is at most a value for a leaf it was asked for,
  which is what its functions return anyway.
The audit hook (refusing process creation, network, ctypes and file access outside the working dir) is a
second layer that guards against accidents and naive escapes, not a boundary (docs/reward.md).
"""

import base64
import errno
import io
import json
import os
import sys
import traceback

WORKDIR = os.path.realpath(os.getcwd())
READ_ROOTS = tuple({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix,
                                                   sys.base_exec_prefix)} | {WORKDIR})
BLOCKED_EVENTS = {"os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "os.kill",
                  "os.killpg", "subprocess.Popen", "pty.spawn", "socket.__new__", "socket.connect", "socket.bind",
                  "socket.getaddrinfo", "os.chdir", "os.setuid", "sys.addaudithook", "resource.setrlimit",
                  "os.startfile", "winreg.OpenKey", "webbrowser.open", "urllib.Request"}
BLOCKED_MODULES = {"ctypes", "_ctypes", "_posixsubprocess", "cffi", "_socket", "socket", "fcntl", "mmap", "pty"}
PATH_EVENTS = {"os.remove", "os.rmdir", "os.rename", "os.mkdir", "os.chmod", "os.chown", "os.link", "os.symlink",
               "os.truncate", "os.utime", "shutil.rmtree", "shutil.copyfile"}
LIST_EVENTS = {"os.listdir", "os.scandir"}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
ITERABLES = ("generator", "map", "filter", "zip", "enumerate", "reversed", "range", "dict_keys", "dict_values",
             "dict_items", "list_iterator", "tuple_iterator")
MAX_ITEMS = 100_000
violations = []


class SandboxViolation(PermissionError):
    pass


def _inside(path, roots):
    if isinstance(path, int):
        return True
    try:
        p = os.path.realpath(os.path.join(WORKDIR, os.fsdecode(path)))
    except (TypeError, ValueError):
        return False
    return any(p == r or p.startswith(r + os.sep) for r in roots)


def _refuse(what):
    violations.append(f"{what} is not allowed")
    try:  # said at once: the program may catch the exception
        os.write(2, f"jetrl-violation: {what} is not allowed\n".encode(errors="replace"))
    except OSError:
        pass
    raise SandboxViolation(f"sandbox: {what} is not allowed")


def audit(event, args):
    if event in BLOCKED_EVENTS or event.startswith("ctypes."):
        _refuse(event)
    elif event == "import":
        if args[0].split(".")[0] in BLOCKED_MODULES:
            _refuse(f"import {args[0]}")
    elif event == "open":
        path, mode, flags = args
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & WRITE_FLAGS)
        if not _inside(path, (WORKDIR,) if writing else READ_ROOTS):
            _refuse(f"{'writing' if writing else 'reading'} {path!r} (outside the sandbox dir)")
    elif event in LIST_EVENTS:
        if args and not _inside(args[0] if args[0] is not None else ".", READ_ROOTS):
            _refuse(f"listing {args[0]!r} (outside the sandbox dir)")
    elif event in PATH_EVENTS:
        for a in args:
            if isinstance(a, (str, bytes, os.PathLike)) and not _inside(a, (WORKDIR,)):
                _refuse(f"{event} {a!r} (outside the sandbox dir)")


class CappedText(io.StringIO):
    """stdout of one request, refusing to grow past `cap` characters."""

    def __init__(self, cap):
        super().__init__()
        self.cap = cap

    def write(self, s):
        if self.tell() + len(s) > self.cap:
            violations.append(f"output over {self.cap} characters")
            raise SandboxViolation(f"sandbox: output over {self.cap} characters")
        return super().write(s)


def encode(v, depth=0, count=None):
    """A value as tagged plain data (the host decodes it strictly; a refusal here fails the test)."""
    count = count if count is not None else [0]
    count[0] += 1
    if depth > 50 or count[0] > MAX_ITEMS:
        raise ValueError("value too large or too deep to return to the scorer")
    if v is None:
        return ["N"]
    if v is True or v is False:
        return ["B", v]
    if isinstance(v, int):
        return ["I", str(int(v))]
    if isinstance(v, float):
        return ["F", repr(float(v))]
    if isinstance(v, str):
        return ["S", str.__str__(v)]
    if isinstance(v, (bytes, bytearray)):
        return ["Y", base64.b64encode(bytes(v)).decode()]
    if isinstance(v, tuple):
        return ["T", [encode(x, depth + 1, count) for x in tuple.__iter__(v)]]
    if isinstance(v, dict):
        return ["D", [[encode(k, depth + 1, count), encode(x, depth + 1, count)] for k, x in dict.items(v)]]
    if isinstance(v, frozenset):
        return ["Z", [encode(x, depth + 1, count) for x in v]]
    if isinstance(v, set):
        return ["E", [encode(x, depth + 1, count) for x in v]]
    if isinstance(v, list) or type(v).__name__ in ITERABLES:
        items = []
        for x in v:
            items.append(encode(x, depth + 1, count))
        return ["L", items]
    raise TypeError(f"a {type(v).__name__} is not plain data the scorer can compare (None, bool, int, float, "
                    "str, bytes, list, tuple, dict, set)")


def _error(exc):
    if isinstance(exc, MemoryError):
        violations.append("memory limit reached (MemoryError)")
    elif isinstance(exc, OSError) and exc.errno == errno.EFBIG:
        violations.append("output over the file size limit")
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()[:500]


def serve(cap):
    requests = os.fdopen(os.dup(0), "rb")
    replies = os.fdopen(os.dup(1), "wb")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(2, 1)  # the program's own writes to fd 1 go to the (capped) stderr pipe, not to the replies
    sys.stdin = io.StringIO("")
    real_stdout = sys.stdout
    shared = {"__name__": "__main__"}
    hooked = False
    for line in requests:
        try:
            req = json.loads(line)
            seq, op, src = req["seq"], req["op"], req["src"]
        except (ValueError, KeyError, TypeError):
            return
        reply = {}
        sys.stdout = CappedText(cap)
        try:
            if op == "load":
                code = compile(src, "solution.py", "exec")
                if not hooked:
                    sys.addaudithook(audit)
                    hooked = True
                exec(code, shared)
                reply["v"] = ["N"]
            elif op == "exec":
                exec(compile(src, "test", "exec"), shared)
                reply["v"] = ["N"]
            else:
                reply["v"] = encode(eval(compile(src, "test", "eval"), shared))
        except BaseException as exc:  # noqa: BLE001 - the program may raise anything, SystemExit included
            reply = {"err": _error(exc), "syntax": isinstance(exc, SyntaxError) and op == "load"}
        finally:
            sys.stdout = real_stdout
        reply["violations"] = violations[:5]
        try:
            data = json.dumps(reply)
        except (ValueError, RecursionError) as exc:
            data = json.dumps({"err": f"reply not encodable: {exc}", "violations": violations[:5]})
        replies.write(f"{seq} {data}\n".encode())
        replies.flush()


def run_io():
    with open("solution.py", encoding="utf-8") as f:
        source = f.read()
    try:
        code = compile(source, "solution.py", "exec")
    except SyntaxError as exc:
        sys.stderr.write(f"jetrl-syntax-error: {exc}\n")
        sys.exit(2)
    sys.addaudithook(audit)
    try:
        exec(code, {"__name__": "__main__"})
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise
    except BaseException as exc:  # noqa: BLE001
        err = _error(exc)
        if isinstance(exc, MemoryError):
            os.write(2, b"jetrl-violation: memory limit reached (MemoryError)\n")
        os.write(2, f"jetrl-error: {err}\n".encode(errors="replace"))
        os._exit(1)
    sys.stdout.flush()


if __name__ == "__main__":
    if sys.argv[1:2] == ["io"]:
        run_io()
    else:
        serve(int(sys.argv[2]) if len(sys.argv) > 2 else 1 << 20)

"""Runs inside the code sandbox (python -I -S -B sandbox_harness.py): not imported by the service.

Reads the nonce from stdin, the program from solution.py and the tests from tests.json in its
working dir, installs an audit hook that refuses process creation, network, ctypes and file access
outside the working dir (the Python stdlib stays readable), then runs every test and appends one
line `<nonce> <json>` per test to result.jsonl. The audit hook guards against accidents and naive
escapes; it is not a security boundary against adversarial code (docs/reward.md, "Code sandbox").
"""

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
    """stdout of one test, refusing to grow past `cap` characters."""

    def __init__(self, cap):
        super().__init__()
        self.cap = cap

    def write(self, s):
        if self.tell() + len(s) > self.cap:
            violations.append(f"output over {self.cap} characters")
            raise SandboxViolation(f"sandbox: output over {self.cap} characters")
        return super().write(s)


def main():
    nonce = sys.stdin.readline().strip()
    with open("solution.py", encoding="utf-8") as f:
        source = f.read()
    with open("tests.json", encoding="utf-8") as f:
        spec = json.load(f)
    out = open("result.jsonl", "a", encoding="utf-8")
    cap = int(spec.get("output_cap", 1 << 20))
    tests = spec["tests"]
    sys.stdin = io.StringIO("")
    try:
        code = compile(source, "solution.py", "exec")
    except SyntaxError as exc:
        out.write(f"{nonce} {json.dumps({'i': -1, 'ok': False, 'error': f'SyntaxError: {exc}'})}\n")
        out.close()
        return
    sys.addaudithook(audit)
    shared = None
    for i, test in enumerate(tests):
        error = None
        real_stdout = sys.stdout
        try:
            if isinstance(test, dict):  # stdin/stdout test: a fresh program run per test
                sys.stdin = io.StringIO(str(test.get("input", "")))
                sys.stdout = CappedText(cap)
                exec(code, {"__name__": "__main__"})
                got = sys.stdout.getvalue()
                ok = got.strip() == str(test.get("output", "")).strip()
                if not ok:
                    error = f"expected {str(test.get('output', ''))[:100]!r}, got {got[:100]!r}"
            else:  # an assert statement run after the program, sharing its globals
                sys.stdout = CappedText(cap)
                if shared is None:
                    shared = {"__name__": "__main__"}
                    exec(code, shared)
                exec(compile(str(test), f"test_{i}", "exec"), shared)
                ok = True
        except BaseException as exc:  # noqa: BLE001 - the program may raise anything, SystemExit included
            ok = False
            if isinstance(exc, MemoryError):
                violations.append("memory limit reached (MemoryError)")
            elif isinstance(exc, OSError) and exc.errno == errno.EFBIG:
                violations.append("output over the file size limit")
            tb = traceback.format_exception_only(type(exc), exc)
            error = "".join(tb).strip()[:500]
        finally:
            sys.stdout = real_stdout
        row = {"i": i, "ok": ok, "error": error, "violations": violations[:5]}
        out.write(f"{nonce} {json.dumps(row)}\n")
        out.flush()
    out.close()


if __name__ == "__main__":
    main()

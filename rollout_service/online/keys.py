"""Client applications' keys (rollout.online.keys_dir): `<app>.key` files, one key per line.

A file must be private (mode 0600: no group or other bits) or it is refused, with the reason logged and
kept in `problems`; a refused file admits nobody. The directory is looked at again at most once a second,
and a file is re-read when its size, mtime or mode changes: adding a line is how a key is rotated in,
deleting it how it is revoked, without a restart. Keys are compared in constant time.
"""

from __future__ import annotations

import hmac
import logging
import os
import re
import time
from pathlib import Path

from shared.runtime.credentials import check_private

log = logging.getLogger("jetrl.online.keys")

APP_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
MIN_KEY_CHARS = 16


def read_key_file(path: Path) -> list[str]:
    """The keys of one `<app>.key` file; ValueError (SecretFileError) naming the problem when it is not private
    (shared/runtime/credentials.check_private), or holds a key
    shorter than MIN_KEY_CHARS or with whitespace inside. Blank lines and `#` comments are skipped."""
    check_private(path, "rollout.online.keys_dir")
    keys = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        key = line.strip()
        if not key or key.startswith("#"):
            continue
        if len(key) < MIN_KEY_CHARS or any(c.isspace() for c in key):
            raise ValueError(f"{path}:{n}: a key needs at least {MIN_KEY_CHARS} characters and no whitespace")
        keys.append(key)
    return keys


class ClientKeys:
    """`app_for(token)`: the application a key belongs to, or None."""

    def __init__(self, keys_dir: str | os.PathLike, recheck_s: float = 1.0):
        self.dir = Path(keys_dir)
        if not self.dir.is_dir():
            raise ValueError(f"rollout.online.keys_dir={str(keys_dir)!r} is not a directory of <app>.key files")
        self.recheck_s = recheck_s
        self._seen: dict[Path, tuple] = {}
        self._keys: dict[str, list[str]] = {}  # app -> its keys
        self.problems: dict[str, str] = {}  # file name -> why it was refused
        self._checked = -1e18
        self.refresh(force=True)

    @property
    def apps(self) -> list[str]:
        return sorted(self._keys)

    def refresh(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._checked < self.recheck_s:
            return
        self._checked = now
        seen: dict[Path, tuple] = {}
        for path in sorted(self.dir.glob("*.key")):
            try:
                st = path.stat()
            except OSError:  # gone since the listing
                continue
            seen[path] = (st.st_size, st.st_mtime_ns, st.st_mode)
        if seen == self._seen:
            return
        keys: dict[str, list[str]] = {}
        problems: dict[str, str] = {}  # every refused file, found again each time anything changed
        for path in seen:
            app = path.name[: -len(".key")]
            try:
                if not APP_RE.fullmatch(app):
                    raise ValueError("the application name must be 1-64 of A-Z a-z 0-9 _ -")
                keys[app] = read_key_file(path)
            except (OSError, ValueError) as exc:
                if self.problems.get(path.name) != str(exc):  # logged once, not at every re-read
                    log.error("online keys: %s refused: %s", path.name, exc)
                problems[path.name] = str(exc)
        self._seen, self._keys, self.problems = seen, keys, problems

    def app_for(self, token: str) -> str | None:
        """The application whose key `token` is (every key is compared, so the time says nothing)."""
        self.refresh()
        found = None
        got = token.encode()
        for app, keys in self._keys.items():
            for key in keys:
                if hmac.compare_digest(got, key.encode()):
                    found = app
        return found

"""link_tree(): a copy of a directory tree that hard-links each file where it can (same filesystem, links
allowed) and copies it where it cannot. A version's files are written once and then only read, so a
link is as good as a copy and costs no bytes: the trainer's staged version into the directory
publisher's version dir, a rollout engine's private snapshot of a version for its server."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another filesystem, or links not allowed
        shutil.copy2(src, dst)


def link_tree(src: str | Path, dst: str | Path) -> Path:
    """Every file under `src` at the same place under `dst` (created, or merged into if it exists)."""
    shutil.copytree(src, dst, copy_function=_link_or_copy, dirs_exist_ok=True)
    return Path(dst)

"""`jetrl rollout` refuses a bad workflow import path at start-up, before connecting anywhere."""

from __future__ import annotations

import subprocess
import sys


def test_bad_workflow_import_path_fails_at_startup_with_a_clear_error():
    out = subprocess.run([sys.executable, "-m", "launcher.cli", "rollout", "rollout.workflow=nopkg.mod:Wf"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "rollout.workflow='nopkg.mod:Wf': no module named 'nopkg'" in out.stderr

"""The sgpu command for the tests that drive it: where it is (SGPU_CLI, which ctest sets to
the build's), a mark that skips a test without it, and `sgpu run` on a script."""

import os
import subprocess
import sys
import textwrap

import pytest

SGPU = os.environ.get("SGPU_CLI", "")
needs_cli = pytest.mark.skipif(not os.access(SGPU, os.X_OK), reason="SGPU_CLI names no sgpu binary")
# tests/workers/nodes_caller.cc, built beside the sgpu command.
NODES_CALLER = os.path.join(os.path.dirname(SGPU), "sgpu_nodes_caller")


def sgpu_run(tmp_path, body, *flags, env=None, timeout=120, wait=True):
    """`sgpu run --backend sim FLAGS -- python script.py`, the script `body` (dedented):
    (returncode, stdout, stderr), or the running Popen when not `wait`."""
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(body))
    command = [SGPU, "run", "--backend", "sim", *flags, "--", sys.executable, str(script)]
    child = subprocess.Popen(command, env=dict(os.environ, **(env or {})), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    if not wait:
        return child
    out, err = child.communicate(timeout=timeout)
    return child.returncode, out, err

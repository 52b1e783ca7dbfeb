"""Several hosts, on one machine: two CPU processes joined by jax.distributed on localhost.

Runs examples/multihost.py, which starts both processes (two forced host devices each), shards
one global batch over all four devices, and checks each process's part against an unsharded
evaluation of the same rows.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "multihost.py"


def test_two_processes_share_one_global_batch():
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    done = subprocess.run([sys.executable, str(EXAMPLE)], env=env, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    reports = sorted((json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")),
                     key=lambda r: r["process_id"])
    assert [r["process_id"] for r in reports] == [0, 1]
    for report in reports:
        assert report["process_count"] == 2
        assert report["global_devices"] == 4 and report["local_devices"] == 2
        assert report["global_shape"] == [8192] and report["local_rows"] == 4096
        assert report["const_arg_devices"] == 4
        assert report["matches_unsharded"]

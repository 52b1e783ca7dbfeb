"""Several hosts: one kernel, its batch split over every device of every process.

Each process calls `jax.distributed.initialize`, builds the same kernel, and passes only its
own part of the batch; `symkern.batching.shard` assembles the global array over a mesh of all
processes' devices, and each process reads back its own part of the result.

On a cluster, start one process per host:

    python examples/multihost.py --coordinator HOST0:1234 --num-processes 2 --process-id 0
    python examples/multihost.py --coordinator HOST0:1234 --num-processes 2 --process-id 1

On one machine, `python examples/multihost.py` starts two CPU processes on localhost (two
forced host devices each, four in all) and checks their results against an unsharded run.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys

ROWS_PER_PROCESS = 4096


def build_kernel():  # noqa: ANN201 - symkern is imported only after jax.distributed is set up
    """The same kernel in every process: a user function closing over a table (a const arg)."""
    import jax.numpy as jnp
    import numpy as np
    import sympy as sp

    import symkern as sk

    x0, x1, a = sp.symbols("x0 x1 a")
    table = np.linspace(0.0, 1.0, 1000) ** 2
    lookup = sp.Function("lookup")
    return sk.build_function(
        [lookup(x0) * a + x1, sp.Matrix([x0 * x1, a])], [x0, x1], params={"a": a},
        functions={"lookup": lambda v: jnp.interp(v, jnp.linspace(0.0, 1.0, table.size), table)})


def global_batch(rows: int):  # noqa: ANN201
    """The whole batch, the same in every process, so that each can check its own part."""
    import numpy as np

    return np.random.default_rng(0).uniform(size=(rows, 2)).astype(np.float32)


def run_process(coordinator: str, num_processes: int, process_id: int) -> dict:
    """One process of the job: initialize, shard, evaluate this process's part, check it."""
    import jax

    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                               process_id=process_id, initialization_timeout=60)
    import numpy as np

    from symkern.batching.shard import shard

    kernel = build_kernel()
    sharded = shard(kernel)                   # a mesh over jax.devices(): every process's devices
    X = global_batch(ROWS_PER_PROCESS * num_processes)
    mine = X[process_id * ROWS_PER_PROCESS:(process_id + 1) * ROWS_PER_PROCESS]
    ps = {"a": 2.0}
    result = sharded(mine, ps)                # a global array over all processes' devices
    local = sharded.local(result)             # this process's rows, as numpy
    expected = kernel(mine, ps)               # the same rows, unsharded, on this process alone
    for got, want in zip(jax.tree_util.tree_leaves(local), jax.tree_util.tree_leaves(expected),
                         strict=True):
        np.testing.assert_allclose(got, np.asarray(want), rtol=1e-6)
    report = {
        "process_id": process_id,
        "process_count": jax.process_count(),
        "global_devices": len(jax.devices()),
        "local_devices": len(jax.local_devices()),
        "global_shape": list(jax.tree_util.tree_leaves(result)[0].shape),
        "local_rows": int(jax.tree_util.tree_leaves(local)[0].shape[0]),
        "const_arg_devices": len(sharded.const_values[0].sharding.device_set),
        "matches_unsharded": True,
    }
    jax.distributed.shutdown()
    return report


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_locally(num_processes: int = 2, devices_per_process: int = 2, timeout: float = 120) -> list[dict]:
    """Start `num_processes` CPU processes on localhost and collect each one's report."""
    coordinator = f"127.0.0.1:{free_port()}"
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"--xla_force_host_platform_device_count={devices_per_process}")
    processes = [subprocess.Popen([sys.executable, __file__, "--coordinator", coordinator,
                                   "--num-processes", str(num_processes), "--process-id", str(i)],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for i in range(num_processes)]
    reports, failures = [], []
    try:
        for i, process in enumerate(processes):
            stdout, stderr = process.communicate(timeout=timeout)
            if process.returncode:
                failures.append(f"process {i} exited {process.returncode}:\n{stderr[-3000:]}")
            else:
                reports.append(json.loads(stdout.strip().splitlines()[-1]))
    finally:
        for process in processes:          # a stuck peer must not outlive the launcher
            if process.poll() is None:
                process.kill()
                process.wait()
    if failures:
        raise RuntimeError("\n".join(failures))
    return reports


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--coordinator", help="HOST:PORT of process 0")
    parser.add_argument("--num-processes", type=int, default=2)
    parser.add_argument("--process-id", type=int)
    args = parser.parse_args()
    if args.process_id is None:
        for report in launch_locally(args.num_processes):
            print(json.dumps(report))
    else:
        print(json.dumps(run_process(args.coordinator, args.num_processes, args.process_id)))


if __name__ == "__main__":
    main()

"""Sharding: the batch split over devices, results equal to the unsharded kernel's.

The four-device checks run in a subprocess, since the device count is fixed when JAX's CPU
backend starts (`--xla_force_host_platform_device_count=4`); the rest run here on one device.
"""

import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import sympy as sp

import symkern as sk
from symkern.batching.shard import ShardedKernel, shard

x0, x1, a = sp.symbols("x0 x1 a")

FOUR_DEVICES = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np, sympy as sp
    from jax.sharding import Mesh
    import symkern as sk
    from symkern.batching.shard import shard

    assert len(jax.devices()) == 4, jax.devices()
    x0, x1, a = sp.symbols("x0 x1 a")
    lookup = sp.Function("lookup")
    table = np.linspace(0.0, 1.0, 1000) ** 2
    kernel = sk.build_function(
        {"y": lookup(x0) * a + x1, "v": sp.Matrix([x0 * x1, a, 1])}, [x0, x1], params={"a": a},
        functions={"lookup": lambda v: jnp.interp(v, jnp.linspace(0.0, 1.0, table.size), table)})
    assert len(kernel.const_args) == 1
    sharded = shard(kernel)
    X = np.random.default_rng(0).uniform(size=(4096, 2)).astype(np.float32)
    ps = {"a": 2.0}

    def same(got, want):
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6)

    # a divisible batch: every result leaf is split in four, a quarter on each device
    result = sharded(X, ps)
    same(result, kernel(X, ps))
    for leaf in jax.tree.leaves(result):
        shards = leaf.addressable_shards
        assert len({s.device for s in shards}) == 4
        assert [s.data.shape[0] for s in shards] == [1024] * 4, [s.data.shape for s in shards]
        assert sorted(s.index[0].start for s in shards) == [0, 1024, 2048, 3072]
        assert leaf.sharding.spec == jax.sharding.PartitionSpec(("batch",))

    # const args: placed once, the whole table on each of the four devices
    (table_arg,) = sharded.const_values
    assert table_arg.sharding.is_fully_replicated and len(table_arg.sharding.device_set) == 4
    for s in table_arg.addressable_shards:
        np.testing.assert_array_equal(np.asarray(s.data), table.astype(np.float32))
    sharded(X, ps)
    assert sharded.const_values[0] is table_arg        # the same buffers, call after call

    # parameters replicated, data split
    consts, data, parameters = sharded.place(X, ps)
    assert all(p.sharding.is_fully_replicated and len(p.sharding.device_set) == 4 for p in parameters)
    assert [s.data.shape for s in data[0].addressable_shards] == [(1024, 2)] * 4

    # not divisible by four: padded, evaluated, sliced (the slice is replicated)
    for n in (1, 3, 10, 4097):
        same(sharded(X[:n], ps), kernel(X[:n], ps))
    same(sharded(X[0], ps), kernel(X[0], ps))           # one sample
    same(sharded(X[:8].reshape(2, 4, 2), ps), kernel(X[:8].reshape(2, 4, 2), ps))  # batch (2, 4)

    # a 2x2 mesh splits the batch four ways too
    mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("hosts", "cores"))
    result = shard(kernel, mesh)(X, ps)
    same(result, kernel(X, ps))
    assert [s.data.shape[0] for s in result["y"].addressable_shards] == [1024] * 4
    print("four devices: ok")
""")


def test_four_forced_host_devices():
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=4")
    done = subprocess.run([sys.executable, "-c", FOUR_DEVICES], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "four devices: ok" in done.stdout


def test_one_device_equals_the_kernel():
    kernel = sk.build_function([sp.sin(x0) * a + x1, sp.Matrix([[x0, x1], [a, 1]])], [x0, x1],
                               params={"a": a})
    sharded = shard(kernel)
    assert isinstance(sharded, ShardedKernel) and sharded.device_count == len(jax.devices())
    X = np.random.default_rng(1).normal(size=(37, 2))
    for got, want in zip(jax.tree.leaves(sharded(X, {"a": 0.5})), jax.tree.leaves(kernel(X, {"a": 0.5})),
                         strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    local = sharded.local(sharded(X, {"a": 0.5}))
    np.testing.assert_allclose(local[1], np.asarray(kernel(X, {"a": 0.5})[1]), rtol=1e-6)


def test_a_kernel_without_parameters_and_the_argument_checks():
    sharded = shard(sk.build_function(x0 * x1, [x0, x1]))
    np.testing.assert_allclose(sharded(np.arange(6.0).reshape(3, 2)), [0.0, 6.0, 20.0])
    try:
        sharded(np.zeros((3, 3)))
    except sk.ArgumentError as error:
        assert "x1" in str(error)
    else:
        raise AssertionError("a wrong shape was accepted")

"""tfbigconv layers train under tf.distribute.MultiWorkerMirroredStrategy.

Two workers on localhost, each a fresh process with its own TF_CONFIG (CPU
only), build the same small model of BigConv2D and BigDepthwiseConv2D layers
from the same seeded initial weights and train it for a few SGD steps (a
custom loop with strategy.run: see below why not model.fit) on the same global
batches, each worker on half of every global batch. A third process trains the
model under the default strategy, on whole global batches, with the same loop
and with model.fit. The workers must end with the same weights as each other
and as the single process, up to float32 rounding (the gradients are summed in
another order). Takes about 8 s on two cores.
"""
import json
import os
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from conftest import run_python

TOL = 1e-4            # relative L2 error per weight, float32
TIMEOUT_S = 240       # for the two workers together
GLOBAL_BATCH = 8
STEPS = 3
LEARNING_RATE = 0.1

# One script for the three processes: with TF_CONFIG set it is a worker of a
# MultiWorkerMirroredStrategy cluster, without it a single process under the
# default strategy. Either trains the model with the same custom loop and
# writes to $OUT (an .npz) its final weights, the global loss of each step and
# the indices of the samples it saw at each step; the single process also
# trains a copy with model.fit, to show that the loop is plain SGD as fit does it.
#
# Why not model.fit under MultiWorkerMirroredStrategy: with Keras 3.15 and
# TF 2.21, fit first builds the model from one batch, taking
# strategy.reduce("MEAN", (x, y), axis=None) of the distributed batch, and
# MultiWorkerMirroredStrategy's reduce (CollectiveAllReduceExtended._reduce_to)
# takes no nested structure when there are several workers: fit fails with
# "Attempt to convert a value (PerReplica:{...}) with an unsupported type" before
# its first step, whatever the layers. MirroredStrategy maps its reduce over
# the structure, so fit works there (test_keras_distribute.py).
SCRIPT = textwrap.dedent(f"""
    import os
    import numpy as np
    import tensorflow as tf
    import keras
    import tfbigconv  # registers the ops; every worker must import it
    from tfbigconv.keras import BigConv2D, BigDepthwiseConv2D

    multi_worker = "TF_CONFIG" in os.environ
    # Created before any other TF call, as MultiWorkerMirroredStrategy requires.
    strategy = (tf.distribute.MultiWorkerMirroredStrategy() if multi_worker
                else tf.distribute.get_strategy())
    lr = float(os.environ.get("LR", "{LEARNING_RATE}"))

    GLOBAL_BATCH, STEPS = {GLOBAL_BATCH}, {STEPS}
    n = GLOBAL_BATCH * STEPS
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, 16, 16, 2)).astype(np.float32)
    y = rng.standard_normal((n, 1)).astype(np.float32)

    def build():
        model = keras.Sequential([
            keras.Input((16, 16, 2)),
            BigConv2D(4, 7, padding="same", activation="relu"),
            BigDepthwiseConv2D(9, padding="same"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(1),
        ])
        # The same initial weights everywhere: normal, scaled by 1/sqrt(fan-in).
        init = np.random.default_rng(1)
        model.set_weights([(init.standard_normal(w.shape) / np.sqrt(w.size / w.shape[-1]))
                           .astype(np.float32) for w in model.get_weights()])
        return model

    # The dataset is batched by the GLOBAL batch size. The strategy's
    # experimental_distribute_dataset, with the DATA auto-shard policy, splits
    # each global batch of {GLOBAL_BATCH} into per-replica batches of
    # {GLOBAL_BATCH} / num_replicas_in_sync = {GLOBAL_BATCH // 2} (one replica per worker) and gives
    # worker i the i-th of each: worker 0 sees samples 0-3 of every global batch,
    # worker 1 samples 4-7. (The default AUTO policy would try FILE sharding
    # first, which in-memory data cannot use; OFF would give every worker
    # the whole dataset.) The single process sees whole global batches.
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    dataset = (tf.data.Dataset.from_tensor_slices((np.arange(n), x, y))
               .batch(GLOBAL_BATCH).with_options(options))

    with strategy.scope():
        model = build()
        optimizer = keras.optimizers.SGD(lr)
        optimizer.build(model.trainable_variables)
    mse = keras.losses.MeanSquaredError(reduction=None)

    def replica_step(xb, yb):
        with tf.GradientTape() as tape:
            # Each replica's share of the mean over the global batch; the
            # optimizer sums the gradients over the replicas (an all-reduce).
            loss = tf.nn.compute_average_loss(mse(yb, model(xb, training=True)),
                                              global_batch_size=GLOBAL_BATCH)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    @tf.function
    def train_step(xb, yb):
        losses = strategy.run(replica_step, args=(xb, yb))
        return strategy.reduce("SUM", losses, axis=None)

    seen, losses = [], []
    for index, xb, yb in strategy.experimental_distribute_dataset(dataset):
        seen.append(np.concatenate([t.numpy() for t in strategy.experimental_local_results(index)]))
        losses.append(float(train_step(xb, yb)))
    assert len(seen) == STEPS, len(seen)

    extra = {{}}
    if not multi_worker:
        fitted = build()
        fitted.compile(optimizer=keras.optimizers.SGD(lr), loss="mse")
        fitted.fit(x, y, batch_size=GLOBAL_BATCH, epochs=1, shuffle=False, verbose=0)
        extra = {{f"fit_{{i}}": w for i, w in enumerate(fitted.get_weights())}}
    np.savez(os.environ["OUT"], **{{f"w_{{i}}": w for i, w in enumerate(model.get_weights())}},
             **{{f"init_{{i}}": w for i, w in enumerate(build().get_weights())}}, **extra,
             loss=np.array(losses), seen=np.stack(seen), replicas=strategy.num_replicas_in_sync)
    print("ok", losses)
""")


def free_ports(count):
    """Ports the OS calls free now (bound to port 0, then released)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def weights(path):
    with np.load(path) as f:
        return {k: f[k] for k in f.files}


def rel_err(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def test_multi_worker_mirrored_strategy_matches_single_process(tmp_path):
    base_env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "2"}
    base_env.pop("TF_CONFIG", None)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in free_ports(2)]}
    outs = [tmp_path / f"worker{i}.npz" for i in range(2)]
    # Output goes to files, not pipes: a worker blocked on a full pipe that
    # nobody reads would stall the other one in the all-reduce.
    logs = [tmp_path / f"worker{i}.log" for i in range(2)]
    workers = []
    try:
        for i in range(2):
            env = dict(base_env, OUT=str(outs[i]), TF_CONFIG=json.dumps(
                {"cluster": cluster, "task": {"type": "worker", "index": i}}))
            with open(logs[i], "w") as log:
                workers.append(subprocess.Popen([sys.executable, "-c", SCRIPT], cwd=tmp_path,
                                                env=env, stdout=log, stderr=subprocess.STDOUT))
        # A worker that fails leaves the other waiting for it: stop both at the deadline.
        deadline = time.monotonic() + TIMEOUT_S
        for p in workers:
            try:
                p.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pytest.fail(f"the workers ran past {TIMEOUT_S} s")
    finally:
        for p in workers:
            if p.poll() is None:
                p.kill()
                p.wait()
    for i, p in enumerate(workers):
        assert p.returncode == 0, f"worker {i}:\n{logs[i].read_text()[-5000:]}"

    single_out = tmp_path / "single.npz"
    run_python(SCRIPT, cwd=tmp_path, env={"CUDA_VISIBLE_DEVICES": "", "OUT": str(single_out)})

    single = weights(single_out)
    multi = [weights(o) for o in outs]
    assert int(single["replicas"]) == 1
    assert [int(m["replicas"]) for m in multi] == [2, 2]

    # Each worker saw its half of every global batch; together, all of it.
    steps = np.arange(GLOBAL_BATCH * STEPS).reshape(STEPS, GLOBAL_BATCH)
    np.testing.assert_array_equal(single["seen"], steps)
    np.testing.assert_array_equal(multi[0]["seen"], steps[:, :GLOBAL_BATCH // 2])
    np.testing.assert_array_equal(multi[1]["seen"], steps[:, GLOBAL_BATCH // 2:])

    names = [k for k in single if k.startswith("w_")]
    assert len(names) == 6  # kernel and bias of BigConv2D, BigDepthwiseConv2D and Dense
    for m in multi:
        for k in names:
            np.testing.assert_array_equal(m["init_" + k[2:]], single["init_" + k[2:]])
    # Training moved every weight well beyond the tolerance (by 1-15 %) ...
    moved = {k: rel_err(single[k], single["init_" + k[2:]]) for k in names}
    assert all(d > 20 * TOL for d in moved.values()), moved
    assert single["loss"][-1] < single["loss"][0], single["loss"]
    # The loop trains as model.fit does (same weights after the same batches) ...
    errors = {k: rel_err(single["fit_" + k[2:]], single[k]) for k in names}
    assert all(e <= TOL for e in errors.values()), errors
    # ... and both workers moved the weights as the single process did.
    for i, m in enumerate(multi):
        errors = {k: rel_err(m[k], single[k]) for k in names}
        assert all(e <= TOL for e in errors.values()), (i, errors)  # NaN fails
        assert rel_err(m["loss"], single["loss"]) <= TOL, (i, m["loss"], single["loss"])
    errors = {k: rel_err(multi[0][k], multi[1][k]) for k in names}
    assert all(e <= TOL for e in errors.values()), errors

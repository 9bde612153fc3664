"""tfbigconv layers train under tf.distribute.MirroredStrategy like any Keras layer,
in both Keras flavours (Keras 3, and Keras 2 = tf_keras).

Logical devices must be configured before TensorFlow initialises its runtime,
which the rest of the suite has done already, so this runs in a fresh process:
two logical CPU devices, one model trained with model.fit on one device and
mirrored on both, from the same initial weights on the same batches.
"""
import pytest

from conftest import run_python

# Float32 gradients summed over two replicas in another order. tf_keras' own
# Conv2D and DepthwiseConv2D in this model differ by 1.6e-5 between the two.
TOL = {"keras3": 1e-5, "keras2": 1e-4}
# flavour -> (the Keras module, tfbigconv's layers for it)
MODULES = {"keras3": ("keras", "tfbigconv.keras"), "keras2": ("tf_keras", "tfbigconv.keras.keras2")}


@pytest.mark.parametrize("flavour", ["keras3", "keras2"])
def test_mirrored_strategy_matches_single_device(flavour, tmp_path):
    keras_module, layers = MODULES[flavour]
    pytest.importorskip(keras_module)
    out = run_python(f"""
        import numpy as np
        import tensorflow as tf
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        import {keras_module} as K
        import tfbigconv
        from {layers} import BigConv2D, BigDepthwiseConv2D

        rng = np.random.default_rng(0)
        x = rng.standard_normal((16, 32, 32, 2)).astype(np.float32)

        def build():
            return K.Sequential([
                K.Input((32, 32, 2)),
                BigConv2D(4, 15, padding="same", activation="relu"),
                BigDepthwiseConv2D(17, padding="same", depth_multiplier=2),
                K.layers.GlobalAveragePooling2D(),
                K.layers.Dense(1),
            ])

        K.utils.set_random_seed(0)
        initial = build().get_weights()
        teacher = build()  # other random weights: a target the model can learn
        y = teacher.predict(x, verbose=0) * 10

        def train(strategy):
            with strategy.scope():
                model = build()
                model.set_weights(initial)
                model.compile(optimizer=K.optimizers.SGD(0.01), loss="mse")
            history = model.fit(x, y, batch_size=8, epochs=4, shuffle=False, verbose=0)
            return model.get_weights(), history.history["loss"]

        mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
        assert mirrored.num_replicas_in_sync == 2

        # The op itself runs on each replica's device.
        per_replica = mirrored.run(lambda: tfbigconv.bigconv2d(
            tf.ones((1, 20, 20, 1)), tf.ones((15, 15, 1, 1)), 1, "VALID"))
        devices = sorted(t.device[-5:] for t in mirrored.experimental_local_results(per_replica))
        assert devices == ["CPU:0", "CPU:1"], devices

        w_single, loss_single = train(tf.distribute.get_strategy())
        w_mirror, loss_mirror = train(mirrored)
        assert loss_mirror[-1] < 0.9 * loss_mirror[0], loss_mirror
        errors = [float(np.linalg.norm(a - b) / np.linalg.norm(a))
                  for a, b in zip(w_single, w_mirror)]
        assert max(errors) < {TOL[flavour]}, errors
        loss_err = max(abs(a - b) / abs(a) for a, b in zip(loss_single, loss_mirror))
        assert loss_err < {TOL[flavour]}, (loss_single, loss_mirror)
        print("ok", loss_mirror, max(errors), loss_err)
    """, cwd=tmp_path, env={"TF_CPP_MIN_LOG_LEVEL": "2"})
    assert out.startswith("ok")

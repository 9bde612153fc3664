"""Grouped Big layers train in a graph with oneDNN on and off (issue 52, item 2).

With oneDNN off, Grappler's remapper fuses TF's grouped Conv2D with the BiasAdd
after it into _FusedConv2D, whose CPU kernel rejects groups; where the planner
runs TF's kernel, planning.candidates then emits the convolution per group
(planning.tf_rules.grouped_conv2d_fusion_fails). Each setting runs in a fresh
process: TF reads TF_ENABLE_ONEDNN_OPTS once, at import.
"""
import json

import pytest

from conftest import run_python

SCRIPT = r"""
import json
import numpy as np, keras, tensorflow as tf
import tfbigconv
from tfbigconv.planning import tf_rules

CASES = [  # (layer class, its keras twin, input shape without batch, kwargs, algorithms)
    ("BigConv2D", "Conv2D", (5, 5, 4), dict(filters=6, kernel_size=2, strides=(2, 1), groups=2),
     ("tf", "auto")),
    ("BigConv2D", "Conv2D", (7, 6, 6), dict(filters=6, kernel_size=3, groups=3, padding="same"),
     ("tf", "auto")),
    ("BigConv2D", "Conv2D", (7, 6, 6), dict(filters=9, kernel_size=3, groups=3, use_bias=False,
                                             activation="relu"), ("tf", "auto")),
    ("BigConv2D", "Conv2D", (6, 7, 6), dict(filters=4, kernel_size=3, groups=2,
                                             data_format="channels_first"), ("auto",)),
    ("BigConv1D", "Conv1D", (9, 4), dict(filters=6, kernel_size=3, groups=2), ("tf", "auto")),
    # Keras' DepthwiseConv2D refuses unequal strides: its twin is grouped Conv2D.
    ("BigDepthwiseConv2D", "Conv2D", (7, 7, 3), dict(kernel_size=3, strides=(2, 1)),
     ("tf", "auto")),
]
TWIN_KWARGS = {"BigDepthwiseConv2D": dict(filters=3, groups=3)}
results = []
rng = np.random.default_rng(0)
for big, twin, shape, kwargs, algorithms in CASES:
    x = rng.standard_normal((4,) + shape).astype("float32")
    for algorithm in algorithms:
        layer = getattr(tfbigconv.keras, big)(algorithm=algorithm, **kwargs)
        model = keras.Sequential([keras.Input(shape), layer])
        model.compile(optimizer="sgd", loss="mse")
        twin_kwargs = dict(kwargs, **TWIN_KWARGS.get(big, {}))
        ref_model = keras.Sequential([keras.Input(shape), getattr(keras.layers, twin)(**twin_kwargs)])
        if kwargs.get("data_format") == "channels_first":  # Keras' CPU kernels: NHWC only
            ref_model = keras.Sequential([keras.Input(shape), keras.layers.Permute((2, 3, 1)),
                                          getattr(keras.layers, twin)(**dict(
                                              twin_kwargs, data_format="channels_last")),
                                          keras.layers.Permute((3, 1, 2))])
        ref_model.set_weights([w.reshape(r.shape) for w, r in
                               zip(model.get_weights(), ref_model.get_weights())])
        y = ref_model.predict(x, verbose=0)
        got = model.predict(x, verbose=0)
        err = float(np.linalg.norm(got - y) / np.linalg.norm(y))
        try:
            loss = model.fit(x, np.zeros_like(y), epochs=2, verbose=0).history["loss"][-1]
            outcome = "ok" if np.isfinite(loss) else f"loss {loss}"
        except Exception as e:  # what the test reports
            outcome = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200]}"
        results.append(dict(case=f"{big} {kwargs} {algorithm}", forward_err=err, fit=outcome))
print(json.dumps(dict(onednn=tfbigconv.host.current().runs_onednn(),
                      fusion_fails=tf_rules.grouped_conv2d_fusion_fails("float32", "NHWC", False),
                      results=results)))
"""


@pytest.mark.parametrize("onednn", ["0", "1"])
def test_grouped_layers_fit_in_a_fresh_process(onednn, tmp_path):
    """Several grouped configurations (groups 2 and 3, strides, with and without
    bias, NCHW, 1-D, a depthwise filter TF runs as grouped Conv2D), forced to
    TF's kernel and under auto (autotuning on): predict() matches Keras' own
    layer and fit() runs, with oneDNN off and on."""
    env = dict(TF_ENABLE_ONEDNN_OPTS=onednn, TFBIGCONV_AUTOTUNE="1",
               TFBIGCONV_AUTOTUNE_CACHE=str(tmp_path / "autotune.json"))
    out = json.loads(run_python(SCRIPT, cwd=str(tmp_path), env=env).strip().splitlines()[-1])
    failed = [r for r in out["results"] if r["fit"] != "ok" or not r["forward_err"] < 1e-5]
    assert not failed, out

"""memory_report on graphs that hold their own gradients: a tf.function
training step (GradientTape, a Keras optimizer's apply_gradients), its
ConcreteFunction, and a TF1 tf.Graph (placeholders, tf.compat.v1's
AdamOptimizer.minimize); and on Keras 2 (tf_keras) models as on Keras 3's."""
import io

import keras
import numpy as np
import pytest
import tensorflow as tf

import tfbigconv
from tfbigconv import host
from tfbigconv.memory import opgraph as S
from tfbigconv.text import fmt_bytes
from tfbigconv.memory.workspaces import ConvPlans

v1 = tf.compat.v1


@pytest.fixture
def eigen_kernels():
    """TF's CPU kernels without oneDNN (TF_ENABLE_ONEDNN_OPTS=0)."""
    with host.use(host.Host(onednn=False)):
        yield


@pytest.fixture
def onednn_kernels():
    with host.use(host.Host(onednn=True,
                            onednn_runs=lambda kernel, dtype, explicit, data_format: not explicit)):
        yield


def _cnn():
    L = keras.layers
    keras.utils.set_random_seed(0)
    return keras.Sequential([keras.Input((16, 16, 3)),
                             L.Conv2D(8, 3, padding="same", activation="relu", name="c1"),
                             L.MaxPooling2D(name="pool"), L.Flatten(name="flat"),
                             L.Dense(4, name="head")], name="cnn")


def _step(model, signature=True):
    optimizer = keras.optimizers.Adam()
    optimizer.build(model.trainable_variables)
    specs = [tf.TensorSpec([None, 16, 16, 3]), tf.TensorSpec([None, 4])]

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss
    return tf.function(step, input_signature=specs if signature else None)


def _tf1_graph(batch=None, resource=True):
    """x(B,16,16,3) -> conv 3x3x3x8 + bias + ReLU (scope "conv") -> max-pool
    (scope "pool") -> mean -> MSE against y; AdamOptimizer.minimize."""
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [batch, 16, 16, 3], name="x")
        y = v1.placeholder(tf.float32, [batch, 8, 8, 8], name="y")
        with v1.variable_scope("conv", use_resource=resource):
            w = v1.get_variable("kernel", [3, 3, 3, 8])
            b = v1.get_variable("bias", [8], initializer=v1.zeros_initializer())
            h = tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(x, w, 1, "SAME"), b))
        with tf.name_scope("pool"):
            h = tf.nn.max_pool2d(h, 2, 2, "VALID")
        loss = tf.reduce_mean(tf.square(h - y))
        train = v1.train.AdamOptimizer(1e-3).minimize(loss)
    return graph, train, loss


def test_tf_function_step_matches_the_keras_models_simulation(eigen_kernels):
    """The graph's own gradient and update ops, run in executor order, give
    the peak the Keras simulation (synthesized gradients) gives the model."""
    model = _cnn()
    step = _step(model)
    for batch in (4, 32):
        graph = tfbigconv.memory_report(step, batch, device="CPU", advice=False)
        ref = tfbigconv.memory_report(model, batch, optimizer="adam", device="CPU",
                                      advice=False)
        assert graph.param_bytes == ref.param_bytes == (3 * 3 * 3 * 8 + 8 + 512 * 4 + 4) * 4
        # Adam's two slots per weight, and its step counter and learning rate (scalars).
        assert 0 <= graph.slot_bytes - 2 * graph.param_bytes <= 16
        assert graph.slots_per_weight == 2 and graph.training
        assert abs(graph.step_peak_bytes / ref.step_peak_bytes - 1) < 0.05, (batch, graph, ref)
    # The ConcreteFunction is the same step.
    concrete = tfbigconv.memory_report(step.get_concrete_function(), 32, device="CPU",
                                       advice=False)
    assert concrete.peak_bytes == graph.peak_bytes


def test_tf_function_rows_are_its_name_scopes(eigen_kernels):
    model = _cnn()
    r = tfbigconv.memory_report(_step(model), 8, device="CPU", advice=False)
    layers = [row for row in r.rows if not row.op]
    by_scope = {row.layer.split("/")[-1].rsplit("_", 1)[0]: row for row in layers}
    conv = by_scope["c1"]
    assert conv.param_bytes == conv.grad_bytes == (3 * 3 * 3 * 8 + 8) * 4
    assert conv.output_shape == [8, 16, 16, 8]
    # The gradient ops are listed under the scope of the forward op they differentiate.
    ops = [row.op for row in r.rows if row.op and row.layer == conv.layer]
    assert "Conv2DBackpropFilter (backward)" in ops and "ReluGrad (backward)" in ops
    # ReLU's output is kept for its gradient; the pool keeps its input and output.
    assert conv.kept_bytes == 8 * 16 * 16 * 8 * 4
    assert layers[-1].layer == "(optimizer)" and layers[-1].slot_bytes == r.slot_bytes
    # The timeline: forward, then backward, then the update, with the step's kinds.
    phases = [s.phase for s in r.timeline.steps]
    assert phases.index("backward") < phases.index("update")
    assert r.timeline.peak.total == r.peak_bytes
    assert max(r.timeline.series(S.PARAM_GRADS)) >= sum(row.grad_bytes for row in layers)
    # scope_depth=1: the model's scope holds its layers' rows.
    top = tfbigconv.memory_report(_step(model), 8, device="CPU", advice=False, scope_depth=1)
    labels = [row.layer for row in top.rows if not row.op]
    assert labels[-1] == "(optimizer)" and conv.layer.split("/")[0] in labels
    assert top.peak_bytes == r.peak_bytes
    assert "graph's report gives no convert_model" in tfbigconv.memory_report(
        _step(model), 8, device="CPU").table()


def test_tf1_graph_hand_checked(eigen_kernels):
    """The TF1 graph's peak is its conv's backward: the filter gradient's
    col_buffer (the planner's estimate of TF's kernel) beside the tensors
    alive then, added up by hand."""
    graph, train, loss = _tf1_graph()
    b = 8
    r = tfbigconv.memory_report(graph, b, fetches=[train, loss], device="CPU", advice=False)
    params = (3 * 3 * 3 * 8 + 8) * 4
    assert r.param_bytes == params
    assert r.slot_bytes == 2 * params + 8  # m and v, and Adam's beta1/beta2 powers
    assert r.persistent_bytes() == params + r.slot_bytes + b * (16 * 16 * 3 + 8 * 8 * 8) * 4
    # The conv's backward: minimize's gating (GATE_OP: a tuple of the op's
    # gradients) runs its input gradient too, beside the filter gradient.
    trace = r._source
    ops = {op.type: op for op in trace.ops if op.phase == "backward"}
    plans = ConvPlans(trace, "CPU")
    ws_in = plans.tf_workspace(ops["Conv2DBackpropInput"], b)["backprop_input"]
    ws = plans.tf_workspace(ops["Conv2DBackpropFilter"], b)["backprop_filter"]
    assert ws > 0 and ws_in > 0
    s = r.peak_step
    assert (s.phase, s.layer) == ("backward", "conv")
    alive = {a.what: a.bytes for a in r.alive_at_peak}
    assert alive["workspace of Conv2DBackpropFilter (tf.Conv2D)"] == ws
    assert alive["workspace of Conv2DBackpropInput (tf.Conv2D)"] == ws_in
    # dL/d(conv output), read by both gradients, and dL/dx being made.
    assert alive["ReluGrad output (gradient)"] == b * 16 * 16 * 8 * 4
    assert alive["Conv2DBackpropInput output (gradient)"] == b * 16 * 16 * 3 * 4
    assert r.step_peak_bytes == sum(a.bytes for a in r.alive_at_peak)
    assert r.peak_bytes == r.persistent_bytes() + r.step_peak_bytes
    # Scopes: "conv" holds the forward ops and their gradients, params and grads.
    conv = next(row for row in r.rows if row.layer == "conv" and not row.op)
    assert conv.param_bytes == conv.grad_bytes == params
    assert conv.tf_workspace[1] == ws + ws_in


def test_tf1_ref_variables_and_a_static_batch(eigen_kernels):
    """RefVariables (VariableV2) are weights too; a graph of static shapes needs
    no batch_size, and max_batch_size says why it has none."""
    graph, train, loss = _tf1_graph(batch=4, resource=False)
    r = tfbigconv.memory_report(graph, fetches=[train, loss], device="CPU", advice=False)
    assert r.batch_size == 4 and r.param_bytes == (3 * 3 * 3 * 8 + 8) * 4
    resource = tfbigconv.memory_report(_tf1_graph(resource=True)[0], 4, device="CPU",
                                       fetches=["Adam", "Mean:0"], advice=False)
    assert r.peak_bytes == resource.peak_bytes
    with pytest.raises(ValueError, match="batch is fixed"):
        r.max_batch_size(1 << 30)


def test_onednn_maxpool_workspace_lives_until_its_gradient(onednn_kernels):
    graph, train, loss = _tf1_graph()
    r = tfbigconv.memory_report(graph, 8, fetches=[train, loss], device="CPU", advice=False)
    ws = [n for n in r._source.tensors if n.endswith(":workspace")]
    assert len(ws) == 1 and r._source.tensors[ws[0]].bytes(8) == 8 * 8 * 8 * 8  # uint8 argmax
    kept = next(row for row in r.rows if row.layer == "pool" and not row.op)
    assert kept.kept_bytes == 8 * 8 * 8 * 8 * (4 + 1)  # the pool's output and its workspace
    assert "MaxPool keeps a workspace for its gradient" in r.table()


def test_elementwise_ops_write_into_a_buffer_no_one_else_reads():
    """TF's element-wise kernels take over an input's buffer (refcount one):
    ReLU cannot take a = 2x, which the Mul after it still reads; the Mul,
    its last reader, writes into a's or ReLU's buffer: two batch buffers at
    the peak, not three (nor one). x, the fed batch, is never taken."""
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [None, 256], name="x")
        a = x * 2.0
        c = a * tf.nn.relu(a)
        total = tf.reduce_sum(c)
    r = tfbigconv.memory_report(graph, 8, fetches=[total], device="CPU", advice=False)
    buffer = 8 * 256 * 4
    assert r.step_peak_bytes == 2 * buffer, r.alive_at_peak
    assert r.persistent_bytes() == buffer  # the batch
    mul = [op for op in r._source.ops if op.type == "Mul"][-1]
    assert [step.total for step in r.timeline.steps if step.op == mul.name] == \
        [r.persistent_bytes() + 2 * buffer]


def test_our_ops_scopes_fold_into_their_callers_scope(eigen_kernels):
    """bigconv1d/2d/3d's own name scopes (TF's "bigconv2d_1" for a second
    call in a scope included) are their caller's: a BigConv2D layer is one
    row, its op's forward and gradient rows under it; a call outside any
    scope keeps its own."""
    import tfbigconv.keras
    L = keras.layers
    keras.utils.set_random_seed(0)
    # algorithm="fft": tfbigconv's ops on every host (auto may run TF's Conv2D here)
    model = keras.Sequential([keras.Input((16, 16, 3)), tfbigconv.keras.BigConv2D(
        8, 5, padding="same", algorithm="fft", name="big"), L.Flatten(name="flat"),
        L.Dense(4, name="head")], name="cnn")
    r = tfbigconv.memory_report(_step(model), 4, device="CPU", advice=False)
    labels = [row.layer for row in r.rows if not row.op]
    big = [label for label in labels if "big" in label.split("/")[-1]]
    assert len(big) == 1 and not big[0].endswith("bigconv2d"), labels
    ops = [row.op for row in r.rows if row.op and row.layer == big[0]]
    assert "BigConv2D" in ops and "BigConv2DBackpropFilter (backward)" in ops, ops
    row = next(row for row in r.rows if row.layer == big[0] and not row.op)
    assert row.param_bytes == row.grad_bytes == (5 * 5 * 3 * 8 + 8) * 4
    assert row.output_shape == [4, 16, 16, 8]

    w2, w1 = tf.Variable(tf.ones([3, 3, 2, 2])), tf.Variable(tf.ones([3, 2, 2]))

    conv2d = lambda x: tfbigconv.bigconv2d(x, w2, 1, "SAME", algorithm="fft")

    @tf.function(input_signature=[tf.TensorSpec([None, 8, 8, 2])])
    def step(x):
        with tf.GradientTape() as tape:
            with tf.name_scope("block"):
                h = conv2d(conv2d(x))
            with tf.name_scope("seq"):
                h = tfbigconv.bigconv1d(tf.reshape(h, [-1, 64, 2]), w1, 1, "SAME",
                                        algorithm="fft")
            loss = tf.reduce_sum(conv2d(tf.reshape(h, [-1, 8, 8, 2])))
        return tape.gradient(loss, [w2, w1])
    r = tfbigconv.memory_report(step, 2, device="CPU", advice=False)
    forward = {op.name: op.layer.label for op in r._source.ops
               if op.type in ("BigConv2D", "BigConv2DBackpropInput")}
    assert sorted(set(forward.values())) == ["bigconv2d", "block", "seq"], forward
    assert any("/bigconv2d_1/" in name for name in forward), forward  # TF's second scope
    assert tfbigconv.memory_report(step, 2, device="CPU", advice=False, scope_depth=4) \
        .peak_bytes == r.peak_bytes


def test_graph_arguments():
    graph, train, loss = _tf1_graph()
    with pytest.raises(ValueError, match="fetches"):
        tfbigconv.memory_report(graph, 4)
    with pytest.raises(ValueError, match="fetches: 'nope:0'"):
        tfbigconv.memory_report(graph, 4, fetches=["nope:0"])
    with pytest.raises(ValueError, match="batch_size"):
        tfbigconv.memory_report(graph, fetches=[train])
    with pytest.raises(ValueError, match="optimizer"):
        tfbigconv.memory_report(graph, 4, fetches=[train], optimizer="adam")
    with pytest.raises(ValueError, match="input_signature"):
        tfbigconv.memory_report(_step(_cnn(), signature=False), 4)
    with pytest.raises(ValueError, match="fetches is for a tf.Graph"):
        tfbigconv.memory_report(_step(_cnn()), 4, fetches=[train])
    with pytest.raises(ValueError, match="scope_depth"):
        tfbigconv.memory_report(_cnn(), 4, scope_depth=1)
    with pytest.raises(ValueError, match="model must be"):
        tfbigconv.memory_report(object(), 4)


def test_graph_report_plots(tmp_path):
    pytest.importorskip("matplotlib")
    graph, train, loss = _tf1_graph()
    r = tfbigconv.memory_report(graph, 4, fetches=[train, loss], device="CPU", advice=False)
    r.plot(tmp_path / "g.png")
    assert (tmp_path / "g.png").stat().st_size > 1000


# --- Keras 2 (tf_keras) ----------------------------------------------------

def _flavour(name):
    """(keras module, BigConv2D) of a flavour; skips without tf_keras."""
    if name == "keras3":
        import tfbigconv.keras
        return keras, tfbigconv.keras.BigConv2D
    tf_keras = pytest.importorskip("tf_keras")
    from tfbigconv.keras import keras2
    return tf_keras, keras2.BigConv2D


FLAVOURS = ["keras3", "keras2"]


def _flavour_cnn(name):
    K, BigConv2D = _flavour(name)
    L = K.layers
    K.utils.set_random_seed(0)
    return K.Sequential([K.Input((32, 32, 3)),
                         L.Conv2D(8, 15, padding="same", activation="relu", name="c15"),
                         L.MaxPooling2D(name="pool"),
                         BigConv2D(4, 5, padding="same", name="big"), L.Flatten(name="flat"),
                         L.Dense(10, name="head")])


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_keras_flavours_give_one_report(flavour, eigen_kernels):
    """A tf_keras model's report is the Keras 3 twin's: the same rows, peak and
    advice (convert_model's effect, mixed precision's clone)."""
    model = _flavour_cnn(flavour)
    model.compile(optimizer="adam", loss="mse")
    r = tfbigconv.memory_report(model, 8, device="CPU", budget=1 << 30)
    twin = tfbigconv.memory_report(_flavour_cnn("keras3"), 8, optimizer="adam", device="CPU",
                                   budget=1 << 30)
    assert r.peak_bytes == twin.peak_bytes and r.slot_bytes == 2 * r.param_bytes > 0
    strip = lambda rows: [(x.layer, x.op, x.output_bytes, x.param_bytes, x.kept_bytes,
                           x.tf_workspace) for x in rows]
    assert strip(r.rows) == strip(twin.rows)
    assert [line.split(" (")[0] for line in r.advice] == \
        [line.split(" (")[0] for line in twin.advice]
    assert any(line.startswith("mixed precision (mixed_bfloat16): ") for line in r.advice)
    assert [layer.name for layer in r.convertible_layers()] == ["c15"]


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_explain_oom_on_a_workspace_limit_in_both_flavours(flavour):
    K, BigConv2D = _flavour(flavour)
    inp = K.Input((40, 40, 1))
    model = K.Model(inp, BigConv2D(2, 15, algorithm="fft", workspace_limit=1024,
                                   name="tight")(inp))
    model.compile(optimizer="sgd", loss="mse")
    x = np.random.default_rng(0).standard_normal((2, 40, 40, 1)).astype(np.float32)
    y = np.zeros((2, 26, 26, 2), np.float32)
    out = io.StringIO()
    explainer = tfbigconv.explain_oom(model, 2, budget=1 << 30, file=out)
    with pytest.raises(tf.errors.ResourceExhaustedError):
        with explainer:
            model.fit(x, y, batch_size=2, epochs=1, verbose=0)
    summary = out.getvalue().splitlines()[0]
    assert "ResourceExhaustedError at batch 2 is a tfbigconv workspace_limit" in summary
    assert "tight does not fit its workspace_limit of 1024 bytes" in summary
    assert explainer.report is not None and explainer.report.batch_size == 2


# --- sizes from the graph's shape inference (issue 60) ---------------------

def test_unknown_dims_get_the_sizes_the_graph_gives_them():
    """The docs' TF1 example: tf.gradients' Sum of the loss's broadcast is
    (None, None, None, None) statically. Each tensor with an unknown static
    dimension gets, at any batch, the shape a session run gives it (not the
    batch in every None), and the peak grows by what an example adds."""
    import docs_graph_steps
    ns = docs_graph_steps.example("tf1")
    graph, train_op, loss = ns["graph"], ns["train_op"], ns["loss"]
    r = tfbigconv.memory_report(graph, 4, fetches=[train_op, loss], device="CPU", advice=False)
    t = r._source
    unknown = [n for n, x in t.tensors.items() if x.itemsize and x.dtype.is_floating
               and x.op.type != "Placeholder" and
               (graph.get_tensor_by_name(n).shape.rank is None or
                None in graph.get_tensor_by_name(n).shape.as_list())]
    assert "gradients/sub_grad/Sum_1:0" in unknown
    rng = np.random.default_rng(0)
    with graph.as_default():
        init = v1.global_variables_initializer()
    with v1.Session(graph=graph) as session:
        session.run(init)
        for batch in (3, 7):
            feed = {p: rng.standard_normal([batch] + p.shape.as_list()[1:])
                    for p in docs_graph_steps.placeholders(graph)}
            values = session.run(unknown, feed)
            assert [list(v.shape) for v in values] == [t.tensors[n].shape(batch) for n in unknown]
    assert not any("shape inference" in note for note in r.notes), r.notes
    # Linear in the batch: an example adds at most a few 64x64x8 float32
    # activations (128 KiB each) and its inputs (176 KiB); the batch in every
    # None made the peak grow as batch**4 (32.1 GiB at batch 256).
    _, each = r.per_example_bytes(256)
    assert each < 1 << 20 and r.peak_at(256) < 256 << 20


def test_tf_function_gradient_sizes_and_a_size_only_the_run_knows():
    """The docs' tf.function example: the loss's Sum gradient is [B, 10], not
    [B, B]. A tensor whose size only the run decides (boolean_mask) is sized
    as the batch, and a note names it."""
    import docs_graph_steps
    r = tfbigconv.memory_report(docs_graph_steps.example("fn")["train_step"], 256, device="CPU",
                                advice=False)
    sums = [x for n, x in r._source.tensors.items()
            if n.startswith("gradient_tape/sub/") and x.op.type == "Sum"]
    assert sums and all(x.shape(256) == [256, 10] for x in sums)
    assert not any("shape inference" in note for note in r.notes), r.notes

    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [None, 16], name="x")
        kept = tf.boolean_mask(x, x > 0)
        total = tf.reduce_sum(kept * 2.0)
    r = tfbigconv.memory_report(graph, 8, fetches=[total], device="CPU", advice=False)
    note = next(n for n in r.notes if "shape inference cannot know" in n)
    assert "boolean_mask" in note and "sized as the batch" in note
    mul = next(x for x in r._source.tensors.values() if x.op.type == "Mul")
    assert mul.shape(8) == [8]


def test_explain_oom_takes_a_tf1_graph_and_its_fetches():
    graph, train, loss = _tf1_graph()
    out = io.StringIO()
    explainer = tfbigconv.explain_oom(graph, 8, fetches=[train, loss], budget=1 << 30, file=out)
    with pytest.raises(tf.errors.ResourceExhaustedError):
        with explainer:
            raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating")
    assert "ResourceExhaustedError at batch 8" in out.getvalue().splitlines()[0]
    assert explainer.report is not None and explainer.report.batch_size == 8
    assert "could not make the report" not in out.getvalue()


def test_graph_row_labels(onednn_kernels):
    """MaxPool's kept column names oneDNN's workspace as such; a scope's row
    is named by its op that allocates the most (not a shape op)."""
    graph, train, loss = _tf1_graph()
    r = tfbigconv.memory_report(graph, 8, fetches=[train, loss], device="CPU", advice=False)
    pool = next(row for row in r.rows if row.layer == "pool" and row.op == "MaxPool")
    out = 8 * 8 * 8 * 8  # elements of the pool's output; its workspace has a byte each
    assert pool.kept == f"output {fmt_bytes(4 * out)}, oneDNN MaxPool workspace {fmt_bytes(out)}"
    top = next(row for row in r.rows if row.layer == "(top level)" and not row.op)
    assert top.kept in ("Sub", "Square"), top

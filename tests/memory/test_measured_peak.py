"""memory_report against a measured training step, in fresh processes, with
oneDNN as this process runs it (TF_ENABLE_ONEDNN_OPTS=0/1): a small U-Net
(Conv2D + BatchNorm + ReLU, MaxPooling2D, a 21x21 BigConv2D, UpSampling2D,
skip Concatenate, Adam). The measurement is benchmarks/bench_memory_report.py's
(oneDNN off: the RSS high-water mark over the second step; on: the peak of
the bytes its tensors and kernels hold in TF's allocator log)."""
import importlib.util
import pathlib

import pytest

from tfbigconv import host

BENCH = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "bench_memory_report.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_memory_report", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.native
def test_small_unet_peak_within_20_percent_of_the_measured_one():
    """Issue 52: 0.73 of the measured batch-dependent peak on a host where TF
    runs its own kernels. The step peak at two batch sizes, and what the
    larger batch adds, are within 20% of the measured ones."""
    bench = _bench()
    onednn = host.current().runs_onednn()
    rows = []
    for batch in bench.MODELS["unet_small"][1]:
        measured = bench.measure("unet_small", "tf", batch, onednn=onednn)
        assert "error" not in measured, measured
        predicted = bench.predict("unet_small", "tf", batch).step_peak_bytes
        rows.append((batch, predicted, measured["measured"]))
    text = ", ".join(f"batch {b}: {p / 2**20:.1f} MiB predicted, {m / 2**20:.1f} measured"
                     for b, p, m in rows) + f" (oneDNN {'on' if onednn else 'off'})"
    for _, predicted, measured in rows:
        assert 0.8 <= predicted / measured <= 1.2, text
    (_, p0, m0), (_, p1, m1) = rows
    assert 0.8 <= (p1 - p0) / (m1 - m0) <= 1.2, text


@pytest.mark.native
@pytest.mark.parametrize("name", ["tf1_unet", "fn_unet"])
def test_graph_step_peak_within_20_percent_of_the_measured_one(name):
    """Issue 53: memory_report of a TF1 U-Net's training step (placeholders,
    Adam's minimize, a Session) and of unet_small's tf.function step
    (GradientTape, Keras' Adam), against the measured second step, at two
    batch sizes."""
    bench = _bench()
    onednn = host.current().runs_onednn()
    for batch in bench.GRAPH_MODELS[name][1]:
        measured = bench.measure(name, "graph", batch, onednn=onednn)
        assert "error" not in measured, measured
        predicted = bench.graph_predict(name, batch).step_peak_bytes
        ratio = predicted / measured["measured"]
        assert 0.8 <= ratio <= 1.2, (f"{name} batch {batch}: {predicted / 2**20:.1f} MiB "
                                     f"predicted, {measured['measured'] / 2**20:.1f} measured "
                                     f"(oneDNN {'on' if onednn else 'off'})")


@pytest.mark.native
@pytest.mark.parametrize("name", ["tf1", "fn"])
def test_docs_graph_examples_scale_with_the_batch(name):
    """Issue 60: docs/memory_report.md's TF1 and tf.function examples at
    batch 256, whose gradients have unknown static dimensions, within 20% of
    the measured step (the batch in every None once predicted 32.1 GiB).
    With oneDNN off the measure is the RSS, and a Session copies its numpy
    feeds into tensors each run (a feed-only graph at batch 256: +43.9 MiB
    for 44.0 MiB of feeds): the TF1 step's prediction counts them too."""
    import docs_graph_steps
    onednn = host.current().runs_onednn()
    r = docs_graph_steps.report(name, 256)
    predicted = r.step_peak_bytes
    if name == "tf1" and not onednn:
        predicted += r.persistent_bytes() - r.param_bytes - r.slot_bytes
    measured = docs_graph_steps.measure(name, 256, onednn)
    assert 0.8 <= predicted / measured <= 1.2, (
        f"{name} batch 256: {predicted / 2**20:.1f} MiB predicted, {measured / 2**20:.1f} "
        f"measured (oneDNN {'on' if onednn else 'off'})")

"""MemoryReport's picture (tfbigconv/memory/timeline.py, plot.py): the timeline
the simulation records, by kind, against the report's peak and its tensors
alive; plot() as PNG and SVG with the peak named; to_tensorboard's event file
read back; the CLI's --plot; the ImportError without matplotlib."""
import glob
import os
import xml.etree.ElementTree as ET

import keras
import matplotlib.image
import matplotlib.text
import numpy as np
import pytest
import tensorflow as tf

import tfbigconv
from tfbigconv.cli import main as cli_main
from tfbigconv.memory import plot as P
from tfbigconv.memory import report as MR
from tfbigconv.memory import opgraph as S
from tfbigconv.memory import timeline as T
from tfbigconv.text import fmt_bytes
from conftest import run_python

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _model():
    """Small U-Net-like: a 3x3 conv, max-pooling, a BigConv2D, upsampling and a
    skip concatenation."""
    L = keras.layers
    inp = keras.Input((24, 24, 2))
    skip = L.Conv2D(4, 3, padding="same", activation="relu", name="c1")(inp)
    h = L.MaxPooling2D(name="pool")(skip)
    h = tfbigconv.keras.BigConv2D(8, 9, padding="same", activation="relu", name="big")(h)
    h = L.Concatenate(name="cat")([L.UpSampling2D(name="up")(h), skip])
    return keras.Model(inp, L.Conv2D(2, 1, name="head")(h))


@pytest.fixture(scope="module")
def reports():
    model = _model()
    return {"training": tfbigconv.memory_report(model, 3, optimizer="adam", advice=False),
            "inference": tfbigconv.memory_report(model, 3, training=False, advice=False)}


@pytest.mark.parametrize("mode", ["training", "inference"])
def test_timeline_adds_up_to_the_peak(reports, mode):
    """Each step's kinds sum to its live total; the largest total is the
    report's peak, at its peak_step; the kinds at the peak add up to the
    tensors alive then, and the persistent kinds are the report's."""
    r = reports[mode]
    tl = r.timeline
    assert tl.kinds == T.KINDS and len(tl.steps) > 10
    totals = tl.totals()
    assert totals == [sum(tl.series(k)[i] for k in tl.kinds) for i in range(len(tl.steps))]
    # The simulation's own live total at each step (persistent + every live buffer).
    live = [total for _, _, total in r._run(r.batch_size, record=True).timeline]
    assert totals == live
    assert max(totals) == r.peak_bytes == tl.peak.total
    assert tl.peak_index == totals.index(r.peak_bytes)  # the first step at the peak
    assert (tl.peak.phase, tl.peak.layer, tl.peak.op) == tuple(r.peak_step)
    persistent = r.persistent_bytes()
    assert set(tl.series(T.WEIGHTS)) == {r.param_bytes}
    assert set(tl.series(T.SLOTS)) == {r.slot_bytes}
    assert all(t >= persistent for t in totals)
    at_peak = dict(zip(tl.kinds, tl.peak.bytes))
    assert sum(at_peak[k] for k in S.STEP_KINDS) == sum(a.bytes for a in r.alive_at_peak)
    assert r.peak_bytes - persistent == r.step_peak_bytes
    grads = sum(a.bytes for a in r.alive_at_peak if a.what.startswith("gradient of"))
    assert at_peak[S.PARAM_GRADS] + at_peak[S.GRADS] == grads


def test_training_and_inference_kinds(reports):
    """Inference keeps nothing for a backward pass and has no gradients or
    slots; training's update step holds every weight's gradient."""
    inf, train = reports["inference"].timeline, reports["training"].timeline
    for kind in (T.SLOTS, S.KEPT, S.PARAM_GRADS, S.GRADS):
        assert not any(inf.series(kind)), kind
    assert {s.phase for s in inf.steps} == {"forward"}
    # The outputs, returned, are alive at the end.
    assert inf.series(S.OUTPUTS)[-1] >= 3 * 24 * 24 * 2 * 4
    r = reports["training"]
    assert [s.phase for s in train.steps][-1] == "update"
    grad_bytes = sum(row.grad_bytes for row in r.rows if not row.op)
    assert train.series(S.PARAM_GRADS)[-1] == grad_bytes > 0
    assert r.slot_bytes == 2 * r.param_bytes > 0
    forward = [i for i, s in enumerate(train.steps) if s.phase == "forward"]
    assert not any(train.series(S.GRADS)[i] + train.series(S.PARAM_GRADS)[i] for i in forward)
    assert any(train.series(S.KEPT)[i] for i in forward)


def test_plot_draws_from_the_recorded_timeline(reports, tmp_path, monkeypatch):
    """plot() reads the timeline computed with the report; it runs no simulation."""
    def no_simulation(*a, **k):
        raise AssertionError("plot re-ran the simulation")
    monkeypatch.setattr(MR, "simulate", no_simulation)
    reports["training"].plot(tmp_path / "t.png")


@pytest.mark.parametrize("mode", ["training", "inference"])
def test_plot_png_and_svg(reports, mode, tmp_path):
    r = reports[mode]
    png, svg = tmp_path / "m.png", tmp_path / "m.SVG"
    fig = r.plot(str(png))
    with open(png, "rb") as f:
        assert f.read(8) == PNG_SIGNATURE
    width, height = (fig.get_size_inches() * fig.dpi).round().astype(int)
    assert matplotlib.image.imread(png).shape[:2] == (height, width)
    r.plot(svg)
    root = ET.parse(svg).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    # The peak is named: its op, layer and bytes, in the annotation.
    texts = [t.get_text() for t in fig.findobj(matplotlib.text.Text)]
    peak = [t for t in texts if r.peak_step.op in t]
    assert len(peak) == 1 and fmt_bytes(r.peak_bytes) in peak[0] and r.peak_step.layer in peak[0]
    # The legend names the kinds that were ever alive, and only those.
    legend = {t.get_text() for t in fig.axes[0].get_legend().get_texts()}
    assert legend == {k for k in r.timeline.kinds if any(r.timeline.series(k))}


def test_plot_rejects_other_suffixes(reports, tmp_path):
    with pytest.raises(ValueError, match=r"path must end in \.png or \.svg.*m\.jpg"):
        reports["training"].plot(tmp_path / "m.jpg")
    assert not os.listdir(tmp_path)


def _events(logdir):
    files = glob.glob(os.path.join(logdir, "events.out.tfevents.*"))
    assert len(files) == 1, files
    values = {}
    for event in tf.compat.v1.train.summary_iterator(files[0]):
        for v in event.summary.value:
            values[v.tag] = (event.step, v)
    return values


def test_to_tensorboard_writes_text_and_image(reports, tmp_path):
    r = reports["training"]
    r.to_tensorboard(str(tmp_path), step=7)
    values = _events(tmp_path)
    assert set(values) == {P.TEXT_TAG, P.IMAGE_TAG}
    step, text = values[P.TEXT_TAG]
    assert step == 7 and text.metadata.plugin_data.plugin_name == "text"
    markdown = tf.make_ndarray(text.tensor).item().decode()
    table = r.table()
    assert markdown.startswith(f"**{table.splitlines()[0]}**\n\n| layer / op")
    for row in table.splitlines():  # every line of the table, as a table row or code
        assert row in markdown
    step, image = values[P.IMAGE_TAG]
    assert step == 7 and image.metadata.plugin_data.plugin_name == "images"
    width, height, png = tf.make_ndarray(image.tensor)
    assert png.startswith(PNG_SIGNATURE)
    pixels = tf.io.decode_png(png).numpy()
    assert pixels.shape[:2] == (int(height), int(width))
    assert len(np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0)) > 8  # drawn, not blank


def test_cli_plot(tmp_path, capsys):
    path = str(tmp_path / "m.keras")
    model = _model()
    model.compile(optimizer="adam", loss="mse")
    model.save(path)
    out = tmp_path / "plot.png"
    assert cli_main(["memory", path, "--batch", "2", "--device", "CPU", "--plot", str(out)]) == 0
    assert f"Plot: {out}" in capsys.readouterr().out
    with open(out, "rb") as f:
        assert f.read(8) == PNG_SIGNATURE
    assert cli_main(["memory", path, "--batch", "2", "--plot", str(tmp_path / "p.gif")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --plot: ") and err.count("\n") == 1, err


def test_without_matplotlib(tmp_path):
    """In a process where matplotlib cannot be imported, tfbigconv imports and
    reports; plot and to_tensorboard raise ImportError saying how to install
    it, and to_tensorboard writes nothing."""
    out = run_python("""
        import os, sys
        sys.modules["matplotlib"] = None   # import matplotlib raises ImportError
        import keras, tfbigconv
        model = keras.Sequential([keras.Input((16, 16, 1)), tfbigconv.keras.BigConv2D(2, 5)])
        r = tfbigconv.memory_report(model, 2, advice=False)
        assert "Peak:" in str(r) and r.timeline.peak.total == r.peak_bytes
        for call in (lambda: r.plot("m.png"), lambda: r.to_tensorboard("logs")):
            try:
                call()
            except ImportError as e:
                print("ImportError:", e)
            else:
                raise AssertionError("no ImportError")
        assert not os.path.exists("m.png") and not os.path.exists("logs")
    """, cwd=tmp_path, env={"TF_CPP_MIN_LOG_LEVEL": "2"})
    lines = [line for line in out.splitlines() if line.startswith("ImportError:")]
    assert len(lines) == 2 and all("pip install matplotlib" in line for line in lines), out


def test_phase_spans_merge_interleaved_runs():
    """A graph's step interleaves its phases: many short runs become a few
    spans, each named by the phase most of its steps run; a Keras step's one
    update step stays inside the backward span."""
    rng = np.random.default_rng(0)
    phases = ["forward"] * 200 + list(rng.choice(["forward", "backward", "update"], 300,
                                                 p=[0.1, 0.8, 0.1])) + ["update"] * 100
    runs = P.phase_runs(phases)
    assert len(runs) > 100 and sum(e - s for s, e, _ in runs) == len(phases)
    spans = P.phase_spans(phases)
    assert [p for _, _, p in spans] == ["forward", "backward", "update"], spans
    assert spans[0][0] == 0 and spans[-1][1] == len(phases)
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    keras_step = ["forward"] * 40 + ["backward"] * 50 + ["update"]
    assert P.phase_spans(keras_step) == [(0, 40, "forward"), (40, 91, "backward")]


def test_a_tf1_graphs_plot_names_few_spans_apart_from_the_peak(tmp_path):
    """The TF1 U-Net's step (about a hundred phase runs) once drew a dashed
    line and a rotated label per run, over the peak's annotation."""
    import importlib.util
    import pathlib
    path = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "bench_memory_report.py"
    spec = importlib.util.spec_from_file_location("bench_memory_report", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    r = bench.graph_predict("tf1_unet", 4)
    assert len(P.phase_runs([s.phase for s in r.timeline.steps])) > 20
    fig = r.plot(tmp_path / "g.png")
    ax = fig.axes[0]
    renderer = fig.canvas.get_renderer()
    names = [t for t in ax.texts if t.get_gid() == "phase"]
    assert 1 <= len(names) <= 6 and all(t.get_rotation() == 0 for t in names)
    assert len(ax.lines) <= 8  # the dashed lines between spans, and the peak's marker
    peak = next(t for t in ax.texts if t.get_gid() == "peak")
    boxes = [t.get_window_extent(renderer) for t in names + [peak]]
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not a.overlaps(b), (a, b)

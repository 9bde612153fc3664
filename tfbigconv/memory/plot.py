"""The memory report as a picture (MemoryReport.plot) and as TensorBoard
summaries (MemoryReport.to_tensorboard).

matplotlib is optional: it is imported here, inside the functions that draw,
and nowhere else in tfbigconv. Figures are drawn on the Agg canvas directly
(no pyplot, no display, the user's matplotlib backend left alone)."""
import collections
import io
import os
import struct

from tfbigconv.text import fmt_bytes
from tfbigconv.memory.timeline import KINDS

FORMATS = ("png", "svg")
# One colour per kind (KINDS order): the persistent kinds grey-blue, the step's
# tensors warm, gradients green, workspaces red.
COLORS = dict(zip(KINDS, ("#8da0cb", "#b3b3d9", "#c7e9f1", "#fdae61", "#fee08b",
                          "#1a9850", "#a6d96a", "#d73027")))
UNITS = (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10), ("B", 1))
# The phase strip: its height (a fraction of the axes), its shade per phase;
# a span this fraction of the steps wide or more is named.
STRIP, LABELLED_SPAN = 0.05, 0.08
PHASE_SHADES = {"forward": "0.92", "backward": "0.75", "update": "0.55"}


def phase_runs(phases):
    """[(start, end, phase)]: the runs of equal phases, end exclusive."""
    runs = []
    for i, phase in enumerate(phases):
        if runs and runs[-1][2] == phase:
            runs[-1][1] = i + 1
        else:
            runs.append([i, i + 1, phase])
    return [tuple(r) for r in runs]


def phase_spans(phases, fraction=0.05):
    """The runs merged into a few spans, [(start, end, phase)]: each step
    takes the phase most steps within `fraction` of the steps around it run;
    a run of those shorter than `fraction` joins the span before it (the
    first, the one after). A graph's step interleaves its phases (a TF1
    U-Net's: 105 runs); a Keras model's runs forward, backward and one
    update step: two spans, the update in the backward's."""
    n = len(phases)
    half = max(1, int(fraction * n) // 2)
    counts = collections.Counter(phases[:half])
    smoothed = []
    for i in range(n):  # counts: the phases of steps i - half .. i + half
        if i + half < n:
            counts[phases[i + half]] += 1
        if i - half - 1 >= 0:
            counts[phases[i - half - 1]] -= 1
        smoothed.append(max(counts, key=lambda p: (counts[p], p == phases[i])))
    spans = []
    for start, end, phase in phase_runs(smoothed):
        if spans and (end - start < fraction * n or spans[-1][2] == phase):
            spans[-1][1] = end
        elif spans and spans[-1][1] - spans[-1][0] < fraction * n:
            spans[-1][1:] = [end, phase]
        else:
            spans.append([start, end, phase])
    return [tuple(s) for s in spans]


def image_format(path):
    """"png" or "svg", from path's suffix; ValueError naming path otherwise."""
    suffix = os.path.splitext(os.fspath(path))[1].lower().lstrip(".")
    if suffix not in FORMATS:
        raise ValueError(f"plot: path must end in .png or .svg (the image format), got {path!r}")
    return suffix


def _matplotlib():
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise ImportError("MemoryReport.plot and to_tensorboard draw with matplotlib, which is "
                          "not installed: pip install matplotlib") from e
    return Figure, FigureCanvasAgg


def figure(report):
    """A matplotlib Figure of report.timeline: live bytes at each step,
    stacked by kind, each step's phase shaded in a strip along the top (the
    main spans named, phase_spans), the peak annotated with its step, layer,
    op and bytes."""
    Figure, FigureCanvasAgg = _matplotlib()
    tl = report.timeline
    fig = Figure(figsize=(11, 5.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    peak = tl.peak
    unit, scale = next((u, s) for u, s in UNITS if peak.total >= s or s == 1)
    x = list(range(len(tl.steps)))
    shown = [k for k in tl.kinds if any(tl.series(k))]  # kinds never alive: not in the legend
    ax.stackplot(x, *[[b / scale for b in tl.series(k)] for k in shown], labels=shown,
                 colors=[COLORS[k] for k in shown], step="mid", linewidth=0)
    top = peak.total / scale
    ax.set_xlim(-0.5, len(x) - 0.5)
    ax.set_ylim(0, top * 1.35)
    ax.set_ylabel(f"live memory ({unit})")
    ax.set_xlabel("step: the ops in the order the simulation runs them")
    what = "training step" if report.training else "inference pass"
    ax.set_title(f"Simulated memory of one {what}: batch {report.batch_size}, "
                 f"device {report.device}" +
                 (f", {report.optimizer}" if report.training and report.optimizer else ""))
    # Phases: a strip along the top, shaded by each step's phase; lines and
    # names only between the few spans phase_spans merges the runs into.
    for start, end, phase in phase_runs([s.phase for s in tl.steps]):
        ax.axvspan(start - 0.5, end - 0.5, ymin=1 - STRIP, ymax=1, color=PHASE_SHADES[phase],
                   linewidth=0)
    for start, end, phase in phase_spans([s.phase for s in tl.steps]):
        if start:
            ax.axvline(start - 0.5, color="0.3", linewidth=0.8, linestyle="--")
        if end - start >= LABELLED_SPAN * len(x):
            ax.text((start + end - 1) / 2, 1 - STRIP / 2, phase, ha="center", va="center",
                    transform=ax.get_xaxis_transform(), fontsize=8, gid="phase")
    # The peak: its step, layer and op, and the bytes alive.
    i = tl.peak_index
    right = i > len(x) / 2
    ax.plot([i], [top], marker="v", color="black", markersize=7)
    ax.annotate(f"peak {fmt_bytes(peak.total)}: {peak.phase} step of {peak.layer}\n{peak.op}",
                xy=(i, top), xytext=(-12 if right else 12, 18), textcoords="offset points",
                ha="right" if right else "left", va="bottom", fontsize=9,
                arrowprops=dict(arrowstyle="-", color="black", linewidth=0.8),
                gid="peak")
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], labels[::-1], loc="upper left", bbox_to_anchor=(0, 1 - STRIP),
              fontsize=8, framealpha=0.9)
    fig.tight_layout()
    return fig


def plot(report, path):
    """Writes figure(report) to path, PNG or SVG by its suffix; returns the Figure."""
    fmt = image_format(path)
    fig = figure(report)
    fig.savefig(path, format=fmt)
    return fig


def png_bytes(report):
    """figure(report) encoded as PNG."""
    buf = io.BytesIO()
    figure(report).savefig(buf, format="png")
    return buf.getvalue()


def markdown(report):
    """The report's table as Markdown: the title in bold, the table, then the
    peak, the tensors alive at it, the advice and the notes as a code block."""
    lines = report.table().splitlines()
    table = [line for line in lines[1:] if line.startswith("|")]
    rest = lines[1 + len(table):]
    return "\n".join([f"**{lines[0]}**", ""] + table + [""] + ["    " + line for line in rest])


TEXT_TAG, IMAGE_TAG = "memory_report/table", "memory_report/timeline"


def to_tensorboard(report, logdir, step=0):
    """Writes the table (tag TEXT_TAG, TensorBoard's text plugin, Markdown) and
    the plot (IMAGE_TAG, its images plugin, PNG) into an event file in logdir.

    tf.summary.text and tf.summary.image live in the tensorboard package;
    these are the same records written with TensorFlow's own summary writer
    (tf.summary.write with each plugin's metadata), so TensorBoard reads them
    and writing them needs no tensorboard."""
    import tensorflow as tf
    from tensorflow.core.framework import summary_pb2
    png = png_bytes(report)  # first: without matplotlib, nothing is written
    width, height = struct.unpack(">II", png[16:24])  # the PNG's IHDR
    meta = lambda plugin, data_class: summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name=plugin),
        data_class=data_class)
    with tf.init_scope():  # eagerly, also when called inside a tf.function
        writer = tf.summary.create_file_writer(os.fspath(logdir))
        with writer.as_default():
            tf.summary.write(TEXT_TAG, tf.constant(markdown(report)), step=step,
                             metadata=meta("text", summary_pb2.DATA_CLASS_TENSOR))
            # The images plugin's tensor: [width, height, png...], all strings.
            tf.summary.write(IMAGE_TAG, tf.constant([b"%d" % width, b"%d" % height, png]),
                             step=step,
                             metadata=meta("images", summary_pb2.DATA_CLASS_BLOB_SEQUENCE))
        writer.flush()
        writer.close()

"""The graph examples of docs/memory_report.md as they are written there: its
tf.function training step ("fn": a Keras CNN, GradientTape, Adam) and its TF1
graph ("tf1": placeholders, a 15x15 conv, AdamOptimizer.minimize), read out
of the document, and each step's peak measured in a fresh process as
benchmarks/bench_memory_report.py measures its graph models (the peak over
three steps after a first: oneDNN off, the RSS high-water mark with
MALLOC_MMAP_THRESHOLD_; on, the logged tensors' peak in TF's allocator log).

Run as a script by measure(): docs_graph_steps.py NAME BATCH [--onednn]."""
import contextlib
import importlib.util
import io
import json
import linecache
import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "memory_report.md"
BENCH = ROOT / "benchmarks" / "bench_memory_report.py"
# A line that names each example's block in the document.
MARKERS = {"fn": "def train_step(x, y):", "tf1": "v1 = tf.compat.v1"}


def bench():
    spec = importlib.util.spec_from_file_location("bench_memory_report", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def example(name):
    """The namespace the document's block for `name` leaves (the block run
    after the document's own imports, keras and tfbigconv, as the document
    runs it): fn's `train_step`, tf1's `graph`, `train_op`, `loss`, `x`, `y`."""
    import keras
    import tensorflow as tf
    import tfbigconv
    blocks = re.findall(r"^```python\n(.*?)^```", DOC.read_text(), flags=re.M | re.S)
    (block,) = [b for b in blocks if MARKERS[name] in b]
    namespace = {"keras": keras, "tf": tf, "tfbigconv": tfbigconv}
    filename = f"{DOC}:{name}"
    # The block's source where autograph looks for a function's (inspect, linecache).
    linecache.cache[filename] = (len(block), None, block.splitlines(True), filename)
    with contextlib.redirect_stdout(io.StringIO()):  # the block's printed table
        exec(compile(block, filename, "exec"), namespace)  # noqa: S102 - our own docs
    return namespace


def placeholders(graph):
    """The TF1 example's placeholders (its inputs), in graph order."""
    return [op.outputs[0] for op in graph.get_operations() if op.type == "Placeholder"]


def report(name, batch):
    """memory_report of the example's step at `batch` (CPU, no advice)."""
    import tfbigconv
    ns = example(name)
    if name == "tf1":
        return tfbigconv.memory_report(ns["graph"], batch, fetches=[ns["train_op"], ns["loss"]],
                                       device="CPU", advice=False)
    return tfbigconv.memory_report(ns["train_step"], batch, device="CPU", advice=False)


def measure_here(name, batch, onednn):
    """Runs the example's step in this process and prints its measured peak
    (bench_memory_report's _measure_second_step)."""
    import numpy as np
    import tensorflow as tf
    ns, rng = example(name), np.random.default_rng(0)
    if name == "tf1":
        graph = ns["graph"]
        with graph.as_default():
            init = tf.compat.v1.global_variables_initializer()
        session = tf.compat.v1.Session(graph=graph)
        session.run(init)
        feed = {p: rng.standard_normal([batch] + p.shape.as_list()[1:]).astype(np.float32)
                for p in placeholders(graph)}
        run = lambda: session.run([ns["train_op"], ns["loss"]], feed)
    else:
        step = ns["train_step"]
        args = [tf.constant(rng.standard_normal([batch] + s.shape.as_list()[1:]), tf.float32)
                for s in step.input_signature]
        run = lambda: step(*args)
    bench()._measure_second_step(run, onednn, steps=3)


def measure(name, batch, onednn):
    """The measured step peak in bytes, in a fresh process, with oneDNN on or
    off, in the environment bench_memory_report.measure sets."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", MALLOC_MMAP_THRESHOLD_="65536",
               TFBIGCONV_AUTOTUNE="0", TF_ENABLE_ONEDNN_OPTS="1" if onednn else "0",
               PYTHONPATH=os.pathsep.join(sys.path))  # not ROOT: its tfbigconv is not built
    if onednn:  # the allocator log
        env.update(TF_CPP_MIN_LOG_LEVEL="0", TF_CPP_VMODULE="log_memory=2")
    r = subprocess.run([sys.executable, __file__, name, str(batch)] +
                       (["--onednn"] if onednn else []), env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    if onednn:
        return bench().logged_peak(r.stderr)
    return json.loads(r.stdout.strip().splitlines()[-1])["measured"]


if __name__ == "__main__":
    measure_here(sys.argv[1], int(sys.argv[2]), "--onednn" in sys.argv)

"""explain_oom: the memory report when a step runs out of memory, and the
summary lines for an out-of-memory error and for a tfbigconv workspace_limit."""
import contextlib
import re
import sys

import tensorflow as tf

from tfbigconv.memory.advice import workspace_limit_advice
from tfbigconv.memory.api import memory_report
from tfbigconv.text import fmt_bytes


class explain_oom(contextlib.ContextDecorator):
    """Prints the memory report when a step runs out of memory, then re-raises.

        with tfbigconv.explain_oom(model, batch_size=16):
            model.fit(x, y, batch_size=16)

        with tfbigconv.explain_oom(graph, 256, fetches=[train_op, loss]):
            session.run([train_op, loss], feed)    # a TF1 graph: its fetches

    On tf.errors.ResourceExhaustedError (TensorFlow's out-of-memory error,
    also raised by tfbigconv's ops when nothing fits their workspace_limit)
    it writes to `file` (default: stderr) the report for `batch_size`: the
    step and layer at the simulated peak, the tensors alive then, and the
    largest batch that fits `budget` (default: the device's free memory).
    When the error is a tfbigconv layer's workspace_limit (the report's
    planner message or op is the error's), the summary says so instead:
    the layer, pass and message, whether algorithm="auto" fits the limit,
    and the largest batch within the limits, if any.
    The error is re-raised unchanged; a failure while reporting is noted and
    never replaces it. Other exceptions pass through untouched.

    `model` is what memory_report takes (a Keras model, a tf.function or
    ConcreteFunction, a TF1 tf.Graph); `fetches` is a tf.Graph's, as
    memory_report's; optimizer and input_shape are for Keras models.
    """

    def __init__(self, model, batch_size, *, budget=None, optimizer=None, device=None,
                 input_shape=None, fetches=None, file=None):
        self.model, self.batch_size, self.budget = model, batch_size, budget
        self.optimizer, self.device, self.input_shape = optimizer, device, input_shape
        self.fetches, self.file = fetches, file
        self.report = None  # the MemoryReport printed, after an OOM

    def __enter__(self):
        return self

    def __exit__(self, kind, error, tb):
        if kind is not None and issubclass(kind, tf.errors.ResourceExhaustedError):
            out = self.file or sys.stderr
            try:
                self.report = memory_report(self.model, self.batch_size, optimizer=self.optimizer,
                                            device=self.device, budget=self.budget,
                                            input_shape=self.input_shape, fetches=self.fetches)
                limits = limit_failures_raised(self.report, error)
                if limits:
                    print(workspace_limit_summary(self.report, limits), file=out)
                else:
                    print(memory_summary(self.report), file=out)
                print(self.report, file=out)
            except Exception as e:  # noqa: BLE001 - never hide the user's error
                print(f"tfbigconv.explain_oom: could not make the report ({type(e).__name__}: "
                      f"{e})", file=out)
        return False  # re-raise


def memory_summary(report):
    """explain_oom's line for running out of memory: the simulated peak, its
    largest tensor and the largest batch that fits."""
    # The advice's own number (one computation, one reading of free memory).
    budget, fits = report.batch_fit()
    s = report.peak_step
    top = report.alive_at_peak[0] if report.alive_at_peak else None
    return (f"tfbigconv.explain_oom: ResourceExhaustedError at batch {report.batch_size}. "
            f"Simulated peak {fmt_bytes(report.peak_bytes)} at the {s.phase} step of {s.layer}"
            + (f"; largest tensor then: {top.what} of {top.layer} ({fmt_bytes(top.bytes)})"
               if top else "")
            + ("; largest batch that fits: unknown (no budget given, free memory unknown)."
               if fits is None else
               f"; largest batch that fits: {fits} (within {fmt_bytes(budget)}"
               + ("; not even batch 1: see the advice)." if fits == 0 else ").")))


def limit_failures_raised(report, error):
    """The report's workspace-limit failures (LimitFailure) that `error` is:
    those whose planner message it carries or whose op it names. A tfbigconv
    op raises ResourceExhaustedError when no plan fits its workspace_limit,
    free memory or not."""
    text = getattr(error, "message", None) or str(error)
    nodes = set(re.findall(r"\{\{node ([^}]+)\}\}|Detected at node (\S+)", text))
    nodes = {n for pair in nodes for n in pair if n}
    return [f for f in report.workspace_limit_failures() if f.message in text or f.op in nodes]


def workspace_limit_summary(report, failures):
    """explain_oom's line for a workspace_limit failure."""
    return (f"tfbigconv.explain_oom: ResourceExhaustedError at batch {report.batch_size} is a "
            f"tfbigconv workspace_limit, not the memory: "
            + workspace_limit_advice(report, failures))

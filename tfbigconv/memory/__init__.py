"""The memory report (memory_report, MemoryReport, explain_oom): rules (what each op's
gradient keeps), trace (a Keras model as ops), graph (a tf.function's or TF1
graph's ops), workspaces (each convolution's), simulate (the liveness
simulations), report (the report), advice, oom (explain_oom) and api (memory_report)."""
from tfbigconv.memory.api import memory_report
from tfbigconv.memory.oom import explain_oom
from tfbigconv.memory.report import MemoryReport

__all__ = ["memory_report", "MemoryReport", "explain_oom"]

"""The memory report (memory_report, MemoryReport, explain_oom): rules (what each op's
gradient keeps, BufferRules), opgraph (a step's ops and buffers, one builder),
trace (a Keras model's step, its gradients synthesized), graph (a tf.function's
or TF1 graph's own ops), workspaces (each convolution's), simulate (the one
liveness simulation), timeline, report (the report), advice, oom (explain_oom),
plot and api (memory_report)."""
from tfbigconv.memory.api import memory_report
from tfbigconv.memory.oom import explain_oom
from tfbigconv.memory.report import MemoryReport

__all__ = ["memory_report", "MemoryReport", "explain_oom"]

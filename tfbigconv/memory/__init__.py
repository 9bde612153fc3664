"""The memory report (memory_report, MemoryReport, explain_oom): rules (what each op's
gradient keeps), trace (the model as ops), workspaces (each convolution's),
simulate (the liveness simulation) and report (the report and its advice)."""
from tfbigconv.memory.report import MemoryReport, explain_oom, memory_report

__all__ = ["memory_report", "MemoryReport", "explain_oom"]

"""MemoryTimeline: the simulated step's live bytes at each op, by kind, as the
liveness simulation (simulate.py) computes them; MemoryReport.timeline holds
it, and MemoryReport.plot draws it (plot.py)."""
import dataclasses
from typing import Tuple

from tfbigconv.memory.opgraph import STEP_KINDS

WEIGHTS, SLOTS, BATCH = "weights", "optimizer slots", "input batch"
# Bottom to top of the stack: what lives across steps, then what the step allocates.
KINDS = (WEIGHTS, SLOTS, BATCH) + STEP_KINDS


@dataclasses.dataclass(frozen=True)
class TimelineStep:
    """One step of the simulation: an op running (or an AddN of gradients, or
    the optimizer's update) and the bytes alive while it runs.

    phase: "forward", "backward" or "update"; layer: the layer call's label
    (or "(loss)", "(model)", "(optimizer)"); op: the op's name;
    bytes: bytes alive by kind, in MemoryTimeline.kinds order."""
    phase: str
    layer: str
    op: str
    bytes: Tuple[int, ...]

    @property
    def total(self):
        return sum(self.bytes)


@dataclasses.dataclass(frozen=True)
class MemoryTimeline:
    """Live bytes over the simulated step, by kind.

    kinds: the kinds' names, bottom of the stack first: weights, optimizer
      slots, input batch (alive throughout), activations kept for backward
      (and oneDNN workspaces a gradient reads), other forward outputs (read by
      a later forward op, or returned, and then freed), weight gradients,
      activation gradients, workspaces (kernels' transient buffers and the
      optimizer update's temporaries).
    steps: the TimelineSteps in the order the simulation runs them.
    peak_index: the first step whose total is the largest: the report's
      peak_step, its total the report's peak_bytes."""
    kinds: Tuple[str, ...]
    steps: Tuple[TimelineStep, ...]
    peak_index: int

    @classmethod
    def from_simulation(cls, timeline, persistent):
        """From simulate()'s Result.timeline and {kind: bytes} of the
        persistent kinds (weights, slots, batch), which sum to the persistent
        bytes the simulation ran with."""
        fixed = tuple(persistent[k] for k in (WEIGHTS, SLOTS, BATCH))
        steps = tuple(TimelineStep(s.phase, s.layer, s.op,
                                   fixed + tuple(by_kind[k] for k in STEP_KINDS))
                      for s, by_kind, _ in timeline)
        totals = [s.total for s in steps]
        return cls(KINDS, steps, totals.index(max(totals)) if totals else -1)

    @property
    def peak(self):
        """The step at the peak (TimelineStep)."""
        return self.steps[self.peak_index]

    def totals(self):
        """[bytes alive at each step]."""
        return [s.total for s in self.steps]

    def series(self, kind):
        """[bytes of `kind` alive at each step]."""
        i = self.kinds.index(kind)
        return [s.bytes[i] for s in self.steps]

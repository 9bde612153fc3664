"""The planner's decision for one pass, typed: a Plan, with an Estimate per candidate.

The C++ planner (_core.plan_pass) returns a read-only _core.PassPlan;
planner.plan reads it into a Plan once, and every layer above reads fields. Plans are frozen: the precision
rule and autotuning return changed copies (Plan.replace, Plan.with_estimate).
"""
import dataclasses
from typing import Optional

from tfbigconv.arguments import Algorithm

# The candidates of every pass, in the order explain lists them.
CANDIDATES = (Algorithm.TF, Algorithm.DIRECT, Algorithm.FFT)


@dataclasses.dataclass(frozen=True)
class Estimate:
    """One candidate of a pass, as the cost model sees it (plan.cc)."""
    available: bool       # it can run the case (TF's kernel: tf_rules)
    fits: bool            # its workspace fits the limit
    seconds: float
    workspace_bytes: int
    peak_bytes: int       # input + filter + output + workspace
    note: str
    terms: tuple = ()     # the cost model's terms (calibration fits them)
    for_auto: bool = True  # False: auto neither times nor picks it (planner's precision rule)

    @classmethod
    def from_core(cls, e):
        """An Estimate of a _core.Estimate."""
        return cls(e.available, e.fits, e.seconds, e.workspace_bytes, e.peak_bytes, e.note,
                   tuple(e.terms))


@dataclasses.dataclass(frozen=True)
class Plan:
    """The table and the choice for one pass on one device.

    tf_kernel names TF's kernel as explain shows it ("tf.Conv2D", or "tf" where
    none runs the case); tf_for_auto is tf_rules' verdict on it ("trusted",
    "measured" or "never"); measured is {candidate: seconds} where timings
    decided, else None; measured_together the gradient pairs' timings where
    they were timed together (autotune.refine_gradients)."""
    pass_: str
    device: str
    limit: int            # the workspace limit planned with, in bytes
    tf_kernel: str
    tf: Estimate
    direct: Estimate
    fft: Estimate
    chosen: Algorithm
    reason: str
    geometry: object      # _core.ConvGeometry
    tf_for_auto: str
    measured: Optional[dict] = None
    measured_together: Optional[dict] = None
    fft_plan: object = None  # _core.FftPlan of the CPU's fft candidate, else None

    @classmethod
    def from_core(cls, p, geometry, tf_for_auto):
        """A Plan of a _core.PassPlan."""
        return cls(p.pass_, p.device, p.limit, p.tf_kernel,
                   *(Estimate.from_core(getattr(p, n.value)) for n in CANDIDATES),
                   Algorithm(p.chosen), p.reason, geometry, tf_for_auto,
                   fft_plan=p.fft_plan if p.device == "CPU" and p.fft.available else None)

    @property
    def tf_trusted(self):
        """Whether TF's kernel's estimate decides (else it is picked only when timed)."""
        return self.tf_for_auto == "trusted"

    def estimate(self, name):
        """The Estimate of candidate `name` ("tf", "direct" or "fft")."""
        return getattr(self, Algorithm(name).value)

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)

    def with_estimate(self, name, **changes):
        """A copy with candidate `name`'s Estimate changed."""
        return self.replace(**{Algorithm(name).value: dataclasses.replace(
            self.estimate(name), **changes)})

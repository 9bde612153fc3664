"""The planner's decision for one pass, typed: a Plan, with an Estimate per candidate.

The C++ planner (_core.plan_pass) returns a read-only _core.PassPlan;
planner.plan reads it into a Plan once, and every layer above reads fields. Plans are frozen: the precision
rule and autotuning return changed copies (Plan.replace, Plan.with_estimate).
"""
import dataclasses
import enum
from typing import Optional

from tfbigconv.arguments import Algorithm, Pass

# The candidates of every pass, in the order explain lists them.
CANDIDATES = (Algorithm.TF, Algorithm.DIRECT, Algorithm.FFT)


class Verdict(enum.StrEnum):
    """Whether auto may pick TF's kernel for a pass (tf_rules.TF_KERNEL_RULES): its
    estimate decides (TRUSTED), only when autotuning timed it fastest (MEASURED),
    or not at all (NEVER). The values are what explain and calibrate show."""
    TRUSTED = "trusted"
    MEASURED = "measured"
    NEVER = "never"

    def __repr__(self):  # as the string it equals (explain, calibrate's output)
        return repr(self.value)


def fft_points(fft_plan):
    """N: the points of one FFT of a CPU fft plan (a _core.FftPlan); None
    without a plan (the GPU's kernel tiles at run time)."""
    if fft_plan is None:
        return None
    return fft_plan.fft_d * fft_plan.fft_h * fft_plan.fft_w


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
    none runs the case); tf_for_auto is tf_rules' Verdict on it; measured is
    {candidate: seconds} where timings decided, else None; measured_together
    the gradient pairs' timings where they were timed together
    (autotune.refine_gradients); fft_points the points of one of fft's
    transforms on the CPU (None: not planned, or the GPU's)."""
    pass_: Pass
    device: str
    limit: int            # the workspace limit planned with, in bytes
    tf_kernel: str
    tf: Estimate
    direct: Estimate
    fft: Estimate
    chosen: Algorithm
    reason: str
    geometry: object      # _core.ConvGeometry
    tf_for_auto: Verdict
    measured: Optional[dict] = None
    measured_together: Optional[dict] = None
    fft_points: Optional[int] = None

    @classmethod
    def from_core(cls, p, geometry, tf_for_auto):
        """A Plan of a _core.PassPlan."""
        cpu_fft = p.device == "CPU" and p.fft.fits
        return cls(Pass(p.pass_), p.device, p.limit, p.tf_kernel,
                   *(Estimate.from_core(getattr(p, n.value)) for n in CANDIDATES),
                   Algorithm(p.chosen), p.reason, geometry, Verdict(tf_for_auto),
                   fft_points=fft_points(p.fft_plan if cpu_fft else None))

    @property
    def tf_trusted(self):
        """Whether TF's kernel's estimate decides (else it is picked only when timed)."""
        return self.tf_for_auto == Verdict.TRUSTED

    def estimate(self, name):
        """The Estimate of candidate `name` ("tf", "direct" or "fft")."""
        return getattr(self, Algorithm(name).value)

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)

    def with_estimate(self, name, **changes):
        """A copy with candidate `name`'s Estimate changed."""
        return self.replace(**{Algorithm(name).value: dataclasses.replace(
            self.estimate(name), **changes)})

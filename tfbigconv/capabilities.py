"""What runs where: for each rank (spatial dimensions) and device, which of
tfbigconv's TensorFlow ops builds the convolution, whether the TF glue registers
it on that device, and whether our C++/CUDA kernels compute that rank.

The one place these facts live: the front end (ops/conv.py), the planner and
planning.tf_rules read them (`of`). tests/test_capabilities.py holds `registered`
to the kernels TensorFlow has registered for our ops.
"""
import dataclasses

# Every op of ours is registered on the CPU (csrc/tf/kernels_cpu.cc).
FALLBACK_DEVICE = "CPU"


@dataclasses.dataclass(frozen=True)
class Capability:
    """What runs a convolution of `rank` spatial dimensions on `device`."""
    rank: int
    device: str
    op: str              # our op the rank builds (1-D runs as 2-D of height 1)
    registered: bool     # the TF glue registers `op` (and its gradients) on `device`
    core_kernels: bool   # our kernels (csrc/core, csrc/cuda) compute the rank: direct and FFT
    source: str          # where `registered` is decided

    @property
    def runs_on(self):
        """Where our op runs when asked for `device`: there, else on the CPU."""
        return self.device if self.registered else FALLBACK_DEVICE

    @property
    def gap(self):
        """Why our op does not run on `device` ("" where it does)."""
        return "" if self.registered else (
            f"bigconv{self.rank}d's ops have no {self.device} kernels")


_CPU = "csrc/tf/kernels_cpu.cc registers BigConv2D and BigConv3D"
_GPU = "csrc/tf/kernels_gpu.cc registers BigConv2D only (kernel_base.h)"

TABLE = {
    (1, "CPU"): Capability(1, "CPU", "BigConv2D", True, True, _CPU),
    (2, "CPU"): Capability(2, "CPU", "BigConv2D", True, True, _CPU),
    (3, "CPU"): Capability(3, "CPU", "BigConv3D", True, True, _CPU),
    (1, "GPU"): Capability(1, "GPU", "BigConv2D", True, True, _GPU),
    (2, "GPU"): Capability(2, "GPU", "BigConv2D", True, True, _GPU),
    # The CUDA kernels run 3-D (docs/gpu.md, "Ranks"); the TF glue does not register it.
    (3, "GPU"): Capability(3, "GPU", "BigConv3D", False, True, _GPU),
}


def of(rank, device):
    """The Capability of `rank` spatial dimensions (1, 2 or 3) on `device`
    (host.DEVICES: "CPU" or "GPU")."""
    return TABLE[rank, device]


def unregistered(rank=None):
    """The entries (of `rank`, or all) whose op the TF glue does not register."""
    return tuple(c for c in TABLE.values()
                 if not c.registered and rank in (None, c.rank))

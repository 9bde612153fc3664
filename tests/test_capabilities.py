"""The capability table (tfbigconv/capabilities.py) against what the op library
registers, and its readers: the planner's device and its error, tf_rules' rule."""
import pytest
import tensorflow as tf
from tensorflow.python.framework import kernels as tf_kernels

import tfbigconv  # noqa: F401  (loads the op library)
from tfbigconv import arguments, capabilities, host
from tfbigconv.planning import planner, tf_rules


def _devices(op):
    """The device types TensorFlow has kernels of `op` for."""
    return {k.device_type for k in tf_kernels.get_registered_kernels_for_op(op).kernel}


@pytest.mark.native
@pytest.mark.parametrize("rank", [1, 2, 3])
@pytest.mark.parametrize("device", host.DEVICES)
def test_registered_is_what_the_library_registers(rank, device):
    """`registered` of every (rank, device) is whether the op and both its gradients
    have kernels there (the library is built with its GPU glue, CUDA or not)."""
    where = capabilities.of(rank, device)
    ops = [where.op, where.op + "BackpropInput", where.op + "BackpropFilter"]
    assert where.registered == all(device in _devices(op) for op in ops), (where, ops)
    assert where.rank == rank and where.device == device
    assert where.runs_on == (device if where.registered else "CPU")
    assert bool(where.gap) != where.registered


def test_3d_on_the_gpu_plans_for_the_cpu_and_explain_says_why():
    spec = lambda fmt: arguments.parse_attrs(len(fmt) - 2, 1, "SAME", fmt, 1)
    assert planner.planning_device(spec("NDHWC"), "GPU") == "CPU"
    assert planner.planning_device(spec("NHWC"), "GPU") == "GPU"
    with pytest.raises(tf.errors.InvalidArgumentError) as e:
        tfbigconv.explain((1, 10, 11, 12, 2), (3, 3, 3, 2, 4), device="GPU")
    assert str(e.value.message) == ("3-D convolutions run on the CPU only (bigconv3d's ops have "
                                    "no GPU kernels): device must be 'CPU'")


def test_tf_rules_never_runs_an_unregistered_rank():
    rule = next(r for r in tf_rules.TF_KERNEL_RULES if "bigconv3d's ops" in r.note)
    assert rule.note == "3-D convolutions run on the CPU (bigconv3d's ops have no GPU kernels)"
    assert rule.verdict == "never"

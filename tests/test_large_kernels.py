"""large_kernels: the min_kernel_size argument and the rule route compares kernels with."""
import numpy as np
import pytest

from tfbigconv.large_kernels import is_large, min_kernel_size


def test_min_kernel_size_forms():
    assert min_kernel_size(15) == (15, 15)
    assert min_kernel_size((7, np.int64(31))) == (7, 31)
    for bad in (0, (3, -1), 2.0, "7", (7,), True, (True, 3)):
        with pytest.raises(ValueError, match="min_kernel_size"):
            min_kernel_size(bad)


@pytest.mark.parametrize("kernel_size, large", [
    ((31,), True), ((14,), False),                       # 1-D: the length against the width
    ((15, 31), True), ((14, 31), False), ((31, 14), False),
    ((1, 15, 31), True), ((31, 14, 31), False),          # 3-D: the depth is not compared
])
def test_is_large(kernel_size, large):
    assert is_large(kernel_size, (15, 15)) is large

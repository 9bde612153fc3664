"""Which kernels are large: the `min_kernel_size` argument and the rule that compares a
kernel with it, for `route` (and `convert_model`, which compares the same way). Nothing
here imports the rest of the package, so that both can use it.
"""
import numbers


def min_kernel_size(value):
    """(height, width) of a `min_kernel_size` argument: a positive int, or a pair of them.
    ValueError naming the argument otherwise."""
    pair = (value, value) if isinstance(value, numbers.Integral) else value
    try:
        h, w = pair
        ok = all(isinstance(v, numbers.Integral) and not isinstance(v, bool) and v >= 1
                 for v in (h, w))
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError("Invalid value for argument `min_kernel_size`: expected a positive int "
                         f"or a pair of them (height, width). Received "
                         f"min_kernel_size={value!r}")
    return int(h), int(w)


def is_large(kernel_size, min_size):
    """Whether a kernel of spatial `kernel_size` (1, 2 or 3 ints) reaches `min_size`
    (height, width): in both height and width; a 1-D kernel's length against the width;
    a 3-D kernel's depth is not compared."""
    min_h, min_w = min_size
    return kernel_size[-1] >= min_w and (len(kernel_size) == 1 or kernel_size[-2] >= min_h)

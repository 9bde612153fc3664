"""The arguments of bigconv2d (tf.nn.conv2d's) and explain, parsed and checked.

Every bad argument raises an exception naming it before anything reaches the
compiled code (whose int64 arguments would otherwise raise a raw TypeError).
"""
import dataclasses
import enum
import numbers
import os
from typing import Mapping, Optional

import numpy as np
import tensorflow as tf

from tfbigconv import errors


class Algorithm(enum.StrEnum):
    """What runs a pass: the planner's choice ("auto"), TensorFlow's own kernel
    ("tf"), or ours ("direct", "fft"). Users pass the strings; Python code carries
    the enum, and the ops' attributes take its value (ConvSpec.op_attrs)."""
    AUTO = "auto"
    TF = "tf"
    DIRECT = "direct"
    FFT = "fft"


# What `algorithm` takes; "im2col" is the earlier name of "tf", still accepted.
ALGORITHMS = tuple(a.value for a in Algorithm) + ("im2col",)
ENV_ALGORITHM = "TFBIGCONV_ALGORITHM"


class Pass(enum.StrEnum):
    """A pass of a convolution, each planned on its own. The values are the names
    explain's tables, the ops' logs and autotune's cache on disk show."""
    FORWARD = "forward"
    BACKPROP_INPUT = "backprop_input"
    BACKPROP_FILTER = "backprop_filter"

    def __repr__(self):  # as the string it equals: explain's dicts print as before
        return repr(self.value)


PASSES = tuple(Pass)
# The dtypes our kernels run; TF_ONLY_DTYPES: tf.nn.conv2d takes them, and
# TensorFlow's Conv2D runs them.
DTYPES = (tf.float16, tf.bfloat16, tf.float32, tf.float64)
TF_ONLY_DTYPES = (tf.int32,)


def requested_algorithm(algorithm):
    """`algorithm` as an Algorithm ("im2col" read as "tf"), unless TFBIGCONV_ALGORITHM
    forces another."""
    forced = os.environ.get(ENV_ALGORITHM)
    if forced:
        if forced not in ALGORITHMS:
            raise errors.invalid_argument(
                f"{ENV_ALGORITHM} must be one of {ALGORITHMS}, got {forced!r}")
        algorithm = forced
    elif algorithm not in ALGORITHMS:
        raise errors.invalid_argument(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    return Algorithm.TF if algorithm == "im2col" else Algorithm(algorithm)


# The exception classes are tf.nn.conv2d's (tests/test_arguments.py holds the table):
# - the form of an argument (a padding list of the wrong shape, strides of
#   length 3): ValueError, which tf.nn.conv2d raises in Python;
# - what TensorFlow's shape function and op definition check (ranks, depths,
#   attribute values, dtypes): ValueError (TypeError for dtypes) while a graph
#   is built, InvalidArgumentError eagerly, where TF's kernel finds it
#   (graph_error);
# - what only TF's kernel checks (strides or dilations in the batch or depth
#   dimension, a filter with no elements): its class, UnimplementedError or
#   InvalidArgumentError, raised at once (ops.conv2d).
def graph_error(message, graph_class=ValueError):
    """An error TF's shape function or op definition finds (see above)."""
    return graph_class(message) if not tf.executing_eagerly() else errors.invalid_argument(message)


# TF1's names of the ops' arguments (tf.compat.v1.nn.conv1d's value=, conv2d's and
# conv3d's filter=), each for the TF2 name it stands for.
TF1_NAMES = {"value": "input", "filter": "filters"}


def tf1_operands(input, filters, padding, use_cudnn_on_gpu=None, **tf1):
    """(input, filters) of a call in TF2's terms or TF1's (tf.compat.v1.nn), as TF
    resolves them: a TF1 name in `tf1` (value=, filter=; None: not given) stands
    for its TF2 name, and both given raise ValueError
    (deprecation.deprecated_argument_lookup's words). use_cudnn_on_gpu (conv1d's
    and conv2d's) must be a bool or None, as TF's op attribute (TypeError in its
    words); it is ignored, as TF's CPU kernels ignore it. A missing operand or
    padding raises the class tf.compat.v1.nn raises for None."""
    given = {"input": input, "filters": filters}
    for old, value in tf1.items():
        new = TF1_NAMES[old]
        if value is not None:
            if given[new] is not None:
                raise ValueError(f"Cannot specify both '{old}' and '{new}'.")
            given[new] = value
    for new, value in given.items():
        if value is None:
            old = [o for o, n in TF1_NAMES.items() if n == new and o in tf1]
            raise ValueError(f"{new} must be given" + (f" (or {old[0]}=, its TF1 name)" if old
                                                       else "") + ", got None")
    if padding is None:
        raise TypeError("padding must be given: 'SAME', 'VALID' or explicit [before, after] "
                        "pairs, got None")
    if use_cudnn_on_gpu is not None and not isinstance(use_cudnn_on_gpu, bool):
        raise TypeError(f"Expected bool for argument 'use_cudnn_on_gpu' not {use_cudnn_on_gpu!r}.")
    return given["input"], given["filters"]


def _value(t):
    """A tensor's value: a TF1 reference (dtype float32_ref, as a reference
    variable's _ref()) is read, as TF's own ops read it."""
    return tf.identity(t) if t.dtype != t.dtype.base_dtype else t


def convert_operands(input, filters, dtypes):
    """input and filters as tensors of one dtype among `dtypes`, as the ops' definitions
    check them (TypeError while a graph is built, InvalidArgumentError eagerly). TF1's
    reference variables and tensors (tf.Variable under disable_v2_behavior, dtype
    float32_ref) count as their base dtype and are read."""
    input = _value(tf.convert_to_tensor(input, name="input"))
    if input.dtype not in dtypes:
        names = [d.name for d in dtypes]
        raise graph_error(f"input dtype must be one of {', '.join(names[:-1])} or {names[-1]}, "
                          f"got {input.dtype.name}", TypeError)
    if isinstance(filters, (tf.Tensor, tf.Variable)):
        if filters.dtype.base_dtype != input.dtype:
            raise graph_error(f"filters dtype {filters.dtype.base_dtype.name} must match input "
                              f"dtype {input.dtype.name}", TypeError)
        return input, _value(tf.convert_to_tensor(filters, name="filters"))
    return input, tf.convert_to_tensor(filters, dtype=input.dtype, name="filters")


# The filter's layout per number of spatial dimensions, for messages.
FILTER_LAYOUTS = {1: "[width, in_channels / groups, out_channels]",
                  2: "[height, width, in_depth / groups, out_depth]",
                  3: "[depth, height, width, in_depth / groups, out_depth]"}


def with_ranks(input, filters, spatial, batch_dims=False):
    """input and filters of a convolution with `spatial` dimensions (rank spatial + 2
    each; batch_dims: input may have more, batch dimensions first): a known wrong rank
    raises ValueError naming the operand (callers raise graph_error's class); an
    unknown rank (tf.TensorSpec(None)) is checked when the graph runs
    (InvalidArgumentError naming the operand) and known from here on, so that what
    follows sees the rank, with unknown dimensions."""
    rank = spatial + 2
    out = []
    for t, what, layout in ((input, "input", ""), (filters, "filters",
                                                   " " + FILTER_LAYOUTS[spatial])):
        if t.shape.rank is None:
            t = _rank_checked(t, rank, f"{what} must be rank {rank}{layout}, got shape")
        elif t.shape.rank < rank or t.shape.rank > rank and not (batch_dims and what == "input"):
            more = " (or more, with batch dimensions first)" if what == "input" else ""
            raise ValueError(f"{what} must be rank {rank}{layout}{more}, got rank "
                             f"{t.shape.rank}: shape {t.shape}")
        out.append(t)
    return out


def _rank_checked(t, rank, message):
    """t of unknown rank, asserted to have `rank` when the graph runs. A tf.cond, not an
    assertion beside t: where grappler knows the fed shapes (a tf.function's call), it
    folds the condition and drops the wrong branch's value, so TF's kernels never see
    (or infer) a wrong rank, which aborts the process in some (oneDNN's Conv2D on a
    rank-3 input, TF 2.21), and our assertion is what fails."""
    def wrong():
        check = tf.debugging.Assert(False, [message, tf.shape(t)])
        with tf.control_dependencies([check]):
            return tf.zeros([1] * rank, t.dtype)  # never used: the assertion fails first

    t = tf.cond(tf.equal(tf.rank(t), rank), lambda: tf.identity(t), wrong)
    t.set_shape([None] * rank)
    return t


def check_filter_not_empty(filter_shape, spatial):
    """TF's kernels' check of a filter with no elements (of rank spatial + 2, else
    nothing to check), its class and words, which code and tests match:
    InvalidArgumentError, in 3-D for any zero dimension (TF's Conv3D, on every
    host), in 1-D and 2-D for a zero spatial or in_depth dimension (a zero
    out_depth gives an empty output, as TF's Eigen Conv2D; oneDNN's raises)."""
    if filter_shape.rank != spatial + 2:
        return
    dims = filter_shape.as_list()
    checked = dims if spatial == 3 else dims[:-1]
    if 0 in checked:
        where = {1: " in width and in_channels", 2: " in height, width and in_depth",
                 3: ""}[spatial]
        raise errors.invalid_argument(
            f"filter must not have zero elements (i.e. all dimensions must be non-zero){where}: "
            f"filters has shape {dims}")


def parse_data_format(value):
    """"NHWC" or "NCHW" (None: "NHWC", as tf.nn.conv2d reads it)."""
    if value is None:
        return "NHWC"
    if not isinstance(value, str) or value.upper() not in ("NHWC", "NCHW"):
        raise graph_error(f"data_format must be 'NHWC' or 'NCHW', got {value!r}")
    return value.upper()


# The 3-D formats; spatial_dims() tells a format's number of spatial dimensions.
DATA_FORMATS_3D = ("NDHWC", "NCDHW")


def spatial_dims(data_format):
    return 3 if data_format in DATA_FORMATS_3D else 2


def parse_data_format_3d(value):
    """"NDHWC" or "NCDHW" (None: "NDHWC", as tf.nn.conv3d reads it)."""
    if value is None:
        return "NDHWC"
    if not isinstance(value, str) or value.upper() not in DATA_FORMATS_3D:
        raise graph_error(f"data_format must be 'NDHWC' or 'NCDHW', got {value!r}")
    return value.upper()


# Parsing raises ValueError naming the argument (explain turns it into
# InvalidArgumentError).
INT64_MAX = 2**63 - 1
# The ops' list attributes (strides, dilations, explicit_paddings) are int32
# in TensorFlow, as tf.nn.conv2d's are.
INT32_MAX = 2**31 - 1


def parse_int(value, name, minimum=-INT64_MAX - 1, maximum=INT64_MAX):
    """An int (Python or NumPy, not bool) in [minimum, maximum]."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an int, got {value!r} of type {type(value).__name__}")
    value = int(value)
    if not minimum <= value <= maximum:
        bits = 31 if maximum == INT32_MAX else 63
        what = ("a non-negative int" if minimum == 0 else "a positive int" if minimum == 1
                else f"an int of at least -2**{bits}")
        raise ValueError(f"{name} must be {what} below 2**{bits}, got {value}")
    return value


def parse_ints(value, name):
    """A list or tuple of int32 attribute values (strings are not lists)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise ValueError(f"{name} must be a list of ints, got {value!r}")
    return [parse_int(v, f"{name} entry", -INT32_MAX - 1, INT32_MAX) for v in value]


def parse_byte_count(value, name, minimum):
    """A size in bytes: an int in [minimum, 2**63); InvalidArgumentError if not
    (our own arguments, not tf.nn.conv2d's)."""
    try:
        return parse_int(value, name, minimum)
    except ValueError as e:
        raise errors.invalid_argument(str(e)) from None


def parse_shape(value, name):
    """A fully known shape (list, tuple or TensorShape) as a list of non-negative ints."""
    if isinstance(value, tf.TensorShape):
        if value.rank is None or not value.is_fully_defined():
            raise ValueError(f"{name} must be fully known, got {value}")
        value = value.as_list()
    if isinstance(value, np.ndarray) and value.ndim == 1:
        value = value.tolist()
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise ValueError(f"{name} must be a list of ints, got {value!r}")
    if any(v is None for v in value):
        raise ValueError(f"{name} must be fully known, got {value!r}")
    return [parse_int(v, f"{name} dimension", 0) for v in value]


def parse_strides(value, name, data_format):
    """strides/dilations in tf.nn.conv2d's forms -> 4 ints in data_format order (in
    tf.nn.conv3d's, for a 3-D data_format: 1, 3 or 5 ints -> 5)."""
    spatial = spatial_dims(data_format)
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        value = [value]
    if isinstance(value, np.ndarray) and value.ndim == 1:
        value = value.tolist()
    if isinstance(value, tf.TensorShape) or not isinstance(value, (list, tuple)) \
            or len(value) not in (1, spatial, spatial + 2):
        raise ValueError(f"{name} must be an int or a list of 1, {spatial} or {spatial + 2} "
                         f"ints, got {value!r}")
    value = parse_ints(value, name)
    if len(value) == 1:
        value = value * spatial
    if len(value) == spatial:
        return [1, *value, 1] if data_format in ("NHWC", "NDHWC") else [1, 1, *value]
    return value


def parse_padding(padding, dims=4, names="'SAME', 'VALID'"):
    """'SAME' / 'VALID' / [[before, after]] * dims -> (padding attr, explicit_paddings);
    dims is 3 (conv1d), 4 (conv2d) or 5 (conv3d); names: the padding names the op
    takes, for messages."""
    if isinstance(padding, str):
        if padding.upper() == "EXPLICIT":  # as tf.nn.conv2d: the pairs say it
            raise ValueError("padding 'EXPLICIT' is not a value to pass: for explicit padding, "
                             f"padding must be a list of {dims} [before, after] pairs")
        return padding.upper(), []
    try:
        pairs = [p for p in padding]
    except TypeError:
        pairs = None
    if pairs is None or isinstance(padding, bytes) or len(pairs) != dims or any(
            isinstance(p, (str, bytes)) or not hasattr(p, "__len__") or len(p) != 2
            for p in pairs):
        raise ValueError(
            f"padding must be {names} or a list of {dims} [before, after] pairs (one "
            f"per dimension), got {padding!r}")
    return "EXPLICIT", [parse_int(x, "explicit padding", -INT32_MAX - 1, INT32_MAX)
                        for p in pairs for x in p]


# tf.nn.conv1d runs tf.nn.conv2d with a height of 1, and so does bigconv1d: its
# arguments in bigconv2d's terms, here, for it and for explain.
# 1-D data formats and the 2-D format each runs as (tf.nn.conv1d also takes the 2-D names).
CONV1D_DATA_FORMATS = {"NWC": "NHWC", "NHWC": "NHWC", "NCW": "NCHW", "NCHW": "NCHW"}


def conv1d_data_format(value):
    """tf.nn.conv1d's data_format ("NWC", "NCW"; None: "NWC") as bigconv2d's."""
    if value is None:
        return "NHWC"
    if not isinstance(value, str) or value not in CONV1D_DATA_FORMATS:  # case as TF's
        raise ValueError(f"data_format must be 'NWC' or 'NCW', got {value!r}")
    return CONV1D_DATA_FORMATS[value]


def conv1d_as_conv2d(stride, padding, data_format, dilations, filter_width):
    """tf.nn.conv1d's stride, padding and dilations (and CAUSAL, as Keras' Conv1D pads)
    as bigconv2d's (strides, padding, dilations) with a height of 1; data_format is
    bigconv2d's ("NHWC" or "NCHW", from conv1d_data_format). filter_width may be None
    (unknown) except for CAUSAL padding. Explicit padding (3 pairs) is checked here, in
    1-D terms: non-negative, zeros in the batch and channel pairs (graph_error's class)."""
    channels_last = data_format == "NHWC"
    strides = _conv1d_strides(stride, "stride", channels_last)
    dils = _conv1d_strides(1 if dilations is None else dilations, "dilations", channels_last)
    for name, values in (("stride", strides), ("dilations", dils)):
        if values[2 if channels_last else 3] <= 0:  # said in 1-D, not bigconv2d's 4 entries
            raise graph_error(f"{name} must be positive, got {values[2 if channels_last else 3]}")
    none = [0, 0]
    if isinstance(padding, str) and padding.upper() == "CAUSAL":
        if filter_width is None:
            raise ValueError("CAUSAL padding needs the filter width when the op is built; "
                             "the filter width is unknown")
        dilation = dils[2] if channels_last else dils[3]
        before = (filter_width - 1) * dilation
        if before > INT32_MAX:  # an int32 attribute, as tf.nn.conv2d's explicit padding
            raise ValueError(
                f"CAUSAL padding puts (filter width - 1) * dilation = ({filter_width} - 1) * "
                f"{dilation} = {before} zeros before the sequence, which must be below 2**31: "
                f"the filter width or dilations is too large")
        pair = [before, 0]
        return strides, ([none, none, pair, none] if channels_last
                         else [none, none, none, pair]), dils
    pad, explicit = parse_padding(padding, dims=3, names="'SAME', 'VALID', 'CAUSAL'")
    if pad != "EXPLICIT":
        return strides, pad, dils  # bigconv2d checks the name
    pairs = [explicit[i:i + 2] for i in range(0, 6, 2)]
    fmt = "NWC" if channels_last else "NCW"
    # What bigconv2d would check in its 4 pairs, in 1-D terms.
    if any(x < 0 for x in explicit):
        raise graph_error(f"explicit padding must be non-negative, got {pairs} for "
                          f"data_format {fmt}")
    if pairs[0] != none or pairs[2 if channels_last else 1] != none:
        raise graph_error(f"explicit padding on the batch and channel dimensions must be 0, "
                          f"got {pairs} for data_format {fmt}")
    # Height [0, 0] added.
    return strides, ([pairs[0], none] + pairs[1:] if channels_last
                     else pairs[:2] + [none, pairs[2]]), dils


def _conv1d_strides(value, name, channels_last):
    """A 1-D stride or dilation (an int, or 1 or 3 ints in data_format order) as
    bigconv2d's 4 ints, height 1. Batch and channel entries other than 1 stay
    where they were: bigconv2d raises TF's Conv2D's class for them, which
    depends on the host and dtype (tf_rules.check_batch_depth), as
    tf.nn.conv1d's Conv2D does."""
    if isinstance(value, np.ndarray) and value.ndim == 1:
        value = value.tolist()
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, (list, tuple)) or len(value) not in (1, 3):
        raise ValueError(f"{name} must be an int or a list of 1 or 3 ints, got {value!r}")
    value = parse_ints(list(value), name)
    if len(value) == 1:
        return [1, 1, value[0], 1] if channels_last else [1, 1, 1, value[0]]
    n, w, c = value if channels_last else (value[0], value[2], value[1])
    return [n, 1, w, c] if channels_last else [n, c, 1, w]


# The arguments of a convolution of 1, 2 or 3 spatial dimensions, for ops.conv and explain.
def parse_format(spatial, data_format):
    """data_format (None: channels last) as the op's: 1-D's as the 2-D one it runs as."""
    if spatial == 1:
        return conv1d_data_format(data_format)
    if spatial == 2:
        return parse_data_format(data_format)
    return parse_data_format_3d(data_format)


# The attributes TensorFlow's own convolution ops share with ours (ConvSpec.tf_attrs),
# and all of ours (ConvSpec.op_attrs, without planned_algorithm).
TF_ATTRS = ("strides", "padding", "explicit_paddings", "data_format", "dilations")
OP_ATTRS = TF_ATTRS + ("algorithm", "workspace_limit_bytes")


def _dim(d):
    """A dimension (int, tf.compat.v1.Dimension or None) as an int or None."""
    d = getattr(d, "value", d)
    return None if d is None else int(d)


@dataclasses.dataclass(frozen=True)
class ConvSpec:
    """One convolution as every layer reads it (parse_attrs makes it): the op's
    attributes (1-D as 2-D with height 1; lists as tuples), what runs it, and
    its operands' channel facts once known (with_operands), from which the
    filter's derived facts (groups, depthwise) are computed here only.

    The ops' boundaries take dicts: tf_attrs() (TensorFlow's ops, autotune's
    cache keys), op_attrs() (ours), geometry_args() (_core's functions)."""
    strides: tuple
    padding: str                  # "SAME", "VALID" or "EXPLICIT"
    explicit_paddings: tuple      # [before, after] per dimension, flat; () unless EXPLICIT
    data_format: str              # "NHWC", "NCHW", "NDHWC" or "NCDHW"
    dilations: tuple
    algorithm: Algorithm = Algorithm.AUTO
    workspace_limit_bytes: int = 0
    in_depth: Optional[int] = None        # the input's channels (None: unknown)
    filter_shape: Optional[tuple] = None  # the op's filter, None where a dimension is unknown

    @classmethod
    def of(cls, attrs):
        """A ConvSpec of a ConvSpec (itself) or of a mapping with the op's attribute
        names (TF's five, and ours: algorithm, workspace_limit_bytes)."""
        if isinstance(attrs, cls):
            return attrs
        if not isinstance(attrs, Mapping):
            raise TypeError(f"attrs must be a ConvSpec or a mapping of the op's attributes, "
                            f"got {type(attrs).__name__}")
        return cls(tuple(attrs["strides"]), attrs["padding"], tuple(attrs["explicit_paddings"]),
                   attrs["data_format"], tuple(attrs["dilations"]),
                   Algorithm(attrs.get("algorithm", Algorithm.AUTO)),
                   int(attrs.get("workspace_limit_bytes", 0)))

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)

    def with_operands(self, input_shape, filter_shape):
        """A copy that knows the operands' channels: the input's depth and the
        filter's dimensions (shapes in data_format order; unknown parts None)."""
        return self.with_filter(self.in_depth_of(input_shape), filter_shape)

    def with_filter(self, in_depth, filter_shape):
        """A copy with the input's depth and the filter's shape (None where unknown)."""
        dims = tf.TensorShape(filter_shape)
        dims = ((None,) * (self.spatial + 2) if dims.rank is None
                else tuple(_dim(d) for d in dims))
        return self.replace(in_depth=_dim(in_depth), filter_shape=dims)

    def in_depth_of(self, shape):
        """The channels of a tensor of `shape` in data_format (None: unknown)."""
        shape = tf.TensorShape(shape)
        return _dim(shape[-1 if self.channels_last else 1]) if shape.rank else None

    @property
    def spatial(self):
        """The op's spatial dimensions: 2 (also 1-D's) or 3."""
        return spatial_dims(self.data_format)

    @property
    def conv3d(self):
        """Whether TF's Conv3D ops run it (no explicit padding, no depthwise kernel)."""
        return self.spatial == 3

    @property
    def channels_last(self):
        return self.data_format in ("NHWC", "NDHWC")

    @property
    def explicit(self):
        return self.padding == "EXPLICIT"

    @property
    def dilated(self):
        return any(d != 1 for d in self.dilations)

    @property
    def filter_dims(self):
        """The filter's dimensions as a list, None where unknown (all, before with_operands)."""
        return list(self.filter_shape or (None,) * (self.spatial + 2))

    @property
    def filter_in_depth(self):
        """The filter's input channels per group (None: unknown)."""
        return self.filter_dims[-2]

    @property
    def grouped(self):
        """Known to have groups: the filter's input channels below the input's."""
        return (self.in_depth is not None and self.filter_in_depth is not None
                and self.in_depth != self.filter_in_depth)

    @property
    def groups(self):
        """The number of groups (None: unknown)."""
        if self.in_depth is None or not self.filter_in_depth:
            return None
        return self.in_depth // self.filter_in_depth

    @property
    def depthwise(self):
        """A 2-D depthwise filter: one input channel per group, several groups."""
        return (not self.conv3d and self.filter_in_depth == 1 and self.in_depth is not None
                and self.in_depth > 1)

    def tf_attrs(self):
        """The attributes of TensorFlow's convolution ops, as lists (the op boundary)."""
        return dict(strides=list(self.strides), padding=self.padding,
                    explicit_paddings=list(self.explicit_paddings),
                    data_format=self.data_format, dilations=list(self.dilations))

    def op_attrs(self, chosen=Algorithm.AUTO):
        """Our op's attributes for a pass planned as `chosen` ("auto": at run time),
        the algorithms as strings (the op boundary)."""
        out = dict(self.tf_attrs(), algorithm=str(self.algorithm),
                   workspace_limit_bytes=self.workspace_limit_bytes)
        if self.algorithm == Algorithm.AUTO and chosen in (Algorithm.DIRECT, Algorithm.FFT):
            out["planned_algorithm"] = str(chosen)
        return out

    def geometry_args(self):
        """(strides, padding, explicit_paddings, data_format, dilations) as _core's
        geometry functions take them, after the shapes."""
        return (list(self.strides), self.padding, list(self.explicit_paddings),
                self.data_format, list(self.dilations))


def parse_attrs(spatial, strides, padding, data_format, dilations, filter_width=None):
    """The ConvSpec (algorithm "auto", no workspace limit, operands unknown) of a
    convolution's arguments in tf.nn.conv1d's, conv2d's or conv3d's forms; 1-D as
    2-D with height 1. data_format is parse_format's. filter_width: 1-D's, for
    CAUSAL padding (None: unknown). Raises ValueError naming the argument
    (graph_error's class where TF's shape function checks it)."""
    if spatial == 1:
        strides, padding, dilations = conv1d_as_conv2d(
            strides, padding, data_format, dilations, filter_width)
    pad, explicit = parse_padding(padding, dims=max(spatial, 2) + 2)
    return ConvSpec(tuple(parse_strides(strides, "strides", data_format)), pad, tuple(explicit),
                    data_format, tuple(parse_strides(dilations, "dilations", data_format)))


def as_op_shapes(spatial, input_shape, filter_shape, data_format):
    """1-D shapes as the 2-D ones they run as (height 1); others as they are."""
    if spatial != 1:
        return input_shape, filter_shape
    at = 1 if data_format == "NHWC" else 2
    return input_shape[:at] + [1] + input_shape[at:], [1] + filter_shape

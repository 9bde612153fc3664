"""route(): a scope in which raw convolution calls with large filters run on tfbigconv.

The mechanism is names looked up at call time. While any scope is active (in any
thread), the public functions are replaced in the modules that hold them:
tf.nn's, tf.compat.v1.nn's and tf.compat.v2.nn's conv1d, conv2d, conv3d, convolution
and depthwise_conv2d (every `tensorflow._api` module named `nn` that holds TF's
function), and Keras 3's TensorFlow backend's `conv` and `depthwise_conv`
(keras.src.backend.tensorflow.nn, which keras.ops and Keras' own layers call). tf_keras'
backend functions call tf.compat.v1.nn.convolution and tf.nn.depthwise_conv2d, so they
are reached through those. The last scope to exit puts TF's and Keras' functions back.

A replaced function routes a call only in the context (thread, asyncio task) that
entered a scope (a context variable), only when the filter's spatial size is known and
large (`large_kernels.is_large`), its dtype is one tfbigconv runs and its arguments
are in a form this module translates; every other call goes to the original function,
unchanged. Calls made by tfbigconv itself (our ops' pure-TF path calls tf.nn) and calls
made while a routed call runs always go to the original: the package never routes into
itself.
"""
import contextvars
import dataclasses
import functools
import inspect
import sys
import threading
import typing
import warnings

import keras
import numpy as np
import tensorflow as tf

from tfbigconv import large_kernels
from tfbigconv.arguments import DTYPES
from tfbigconv.keras.base import check_options
from tfbigconv.ops.conv1d import bigconv1d
from tfbigconv.ops.conv2d import bigconv2d
from tfbigconv.ops.conv3d import bigconv3d
from tfbigconv.ops.depthwise import depthwise_conv2d

# The active scopes of this context, innermost last.
_scopes = contextvars.ContextVar("tfbigconv_route", default=())
# True while a routed call runs, or a declined one runs TF's (Keras') own function.
_bypass = contextvars.ContextVar("tfbigconv_route_bypass", default=False)

_BIGCONV = {1: bigconv1d, 2: bigconv2d, 3: bigconv3d}
_FORMATS = {1: ("NWC", "NCW"), 2: ("NHWC", "NCHW"), 3: ("NDHWC", "NCDHW")}  # last, first
_TF_NAMES = ("conv1d", "conv2d", "conv3d", "convolution", "depthwise_conv2d")
_KERAS_MODULE = "keras.src.backend.tensorflow.nn"


@dataclasses.dataclass(frozen=True)
class RoutedCall:
    """One large convolution a `route` scope saw.

    name: the function called ("tf.nn.depthwise_conv2d", "keras.ops.conv");
    where: the name scope it was built in (in Keras, the layers' names; "" at the top);
    kernel_size: its spatial size, or None where it is not known when it is built;
    converted: whether it ran on tfbigconv; reason: why not ("" if converted).
    """
    name: str
    where: str
    kernel_size: typing.Optional[tuple]
    converted: bool
    reason: str = ""

    def __str__(self):
        size = "x".join(map(str, self.kernel_size)) if self.kernel_size else "size unknown"
        text = f"{self.name} {size}" + (f" in {self.where}" if self.where else "")
        return text if self.converted else f"{text}: {self.reason}"


@dataclasses.dataclass
class RouteReport:
    """The large convolutions a `route` scope saw, each once, with how often it was seen
    (`counts`: a model traced for fit and predict builds each convolution again).

    `converted` and `missed` list them; `str(report)` is a readable summary;
    `warning()` says what to warn about: large kernels seen and none converted.
    """
    title: str
    counts: dict = dataclasses.field(default_factory=dict)  # {RoutedCall: times seen}

    def add(self, convolution):
        self.counts[convolution] = self.counts.get(convolution, 0) + 1

    @property
    def converted(self):
        return [c for c in self.counts if c.converted]

    @property
    def missed(self):
        return [c for c in self.counts if not c.converted]

    def warning(self):
        """The message to warn with ("" if none): large kernels seen, none converted."""
        large = [c for c in self.missed if c.kernel_size]
        if not large or self.converted:
            return ""
        return (f"{self.title}: {len(large)} large convolution(s) seen and none converted, "
                "they run on TensorFlow's own ops:\n" + "\n".join(f"  {c}" for c in large))

    def __str__(self):
        lines = [f"{self.title}: {len(self.converted)} converted, {len(self.missed)} not"]
        for c, n in self.counts.items():
            times = f" ({n} times)" if n > 1 else ""
            lines.append(f"  {'converted' if c.converted else 'not converted'}: {c}{times}")
        return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class _Call:
    """What route makes of one call: the filter's spatial size (None: not known), and
    either `run` (the call on tfbigconv) or why not (`reason`). `delegate`: the original
    runs with routing left on, because it makes calls that route (Keras' depthwise
    decomposition of strides with dilations)."""
    kernel_size: typing.Optional[tuple]
    run: typing.Optional[typing.Callable] = None
    reason: str = ""
    delegate: bool = False


def _is_operand(x):
    return tf.is_tensor(x) or isinstance(x, (tf.Variable, np.ndarray, np.generic))


def _spatial_size(filters, spatial=None):
    """The filter's spatial size (all but its last two dimensions), or None if unknown."""
    shape = tf.TensorShape(getattr(filters, "shape", None))
    if shape.rank is None or shape.rank < 3 or (spatial and shape.rank != spatial + 2):
        return None
    size = shape[:-2].as_list()
    return None if None in size else tuple(size)


def _operands(*operands):
    """Why the operands cannot run on tfbigconv ("" if they can)."""
    for x in operands:
        if not _is_operand(x):
            return f"an operand of type {type(x).__name__}, not a tensor"
    dtypes = {tf.as_dtype(x.dtype) for x in operands}
    if len(dtypes) != 1 or dtypes.pop() not in DTYPES:
        return (f"dtype {'/'.join(sorted({tf.as_dtype(x.dtype).name for x in operands}))}: "
                "tfbigconv runs float16, bfloat16, float32 and float64")
    return ""


def _ints(value, n):
    """An int-or-list argument (strides, dilations) as its n spatial entries, or None."""
    if value is None:
        return (1,) * n
    try:
        values = [int(v) for v in (value if np.ndim(value) else [value])]
    except (TypeError, ValueError):
        return None
    if len(values) == 1:
        return tuple(values) * n
    if len(values) == n:
        return tuple(values)
    return tuple(values[1:-1]) if len(values) == n + 2 else None


def _tf_conv(bigconv, spatial):
    """tf.nn.conv1d/2d/3d (TF1's and TF2's forms): bigconvNd takes every form of them,
    so the arguments pass as they were bound to the original's signature."""
    def read(args, options):
        x = args.get("input", args.get("value"))
        f = args.get("filters", args.get("filter"))
        size = _spatial_size(f, spatial)
        why = _operands(x, f) if size else "the filter's size is not known"
        return _Call(size, reason=why) if why else _Call(
            size, run=lambda: bigconv(**args, **options))
    return read


def _tf_convolution(args, options):
    """tf.nn.convolution, TF1's (filter=, dilation_rate=) and TF2's form."""
    x, f = args.get("input"), args.get("filters", args.get("filter"))
    size = _spatial_size(f)
    if not size:
        return _Call(None, reason="the filter's size is not known")
    spatial = len(size)
    why = _operands(x, f)
    padding = args.get("padding", "VALID")
    data_format = args.get("data_format")
    dilations = args.get("dilations", args.get("dilation_rate"))
    strides, rates = _ints(args.get("strides"), spatial), _ints(dilations, spatial)
    if why:
        pass
    elif ("filter" in args and "filters" in args) or (
            "dilations" in args and "dilation_rate" in args):
        why = "both the TF1 and TF2 name of an argument"
    elif padding not in ("SAME", "VALID"):
        why = f"padding={padding!r}"
    elif data_format not in (None,) + _FORMATS[spatial]:
        why = f"data_format={data_format!r} for a {spatial}-D filter"
    elif strides is None or rates is None or (max(strides) > 1 and max(rates) > 1):
        why = f"strides={args.get('strides')!r} with dilations={dilations!r}"
    if why:
        return _Call(size, reason=why)
    stride_name = "stride" if spatial == 1 else "strides"
    kwargs = {stride_name: strides, "padding": padding,
              "data_format": data_format or _FORMATS[spatial][0], "dilations": rates,
              "name": args.get("name")}
    return _Call(size, run=lambda: _BIGCONV[spatial](x, f, **kwargs, **options))


def _tf_depthwise(args, options):
    """tf.nn.depthwise_conv2d (TF1's rate= too): tfbigconv.depthwise_conv2d has its
    signature and filter layout."""
    x, f = args.get("input"), args.get("filter")
    size = _spatial_size(f, 2)
    why = _operands(x, f) if size else "the filter's size is not known"
    return _Call(size, reason=why) if why else _Call(
        size, run=lambda: depthwise_conv2d(**args, **options))


def _keras_format(args, spatial):
    """keras.ops' data_format as TF's name for `spatial` dimensions, or None."""
    data_format = args.get("data_format") or keras.config.image_data_format()
    if data_format == "channels_last":
        return _FORMATS[spatial][0]
    return _FORMATS[spatial][1] if data_format == "channels_first" else None


def _keras_common(args):
    """(spatial size, TF data format, padding, strides, rates, reason) of a keras.ops call."""
    x, f = args.get("inputs"), args.get("kernel")
    size = _spatial_size(f)
    if not size:
        return None, None, None, None, None, "the filter's size is not known"
    spatial = len(size)
    padding = args.get("padding", "valid")
    data_format = _keras_format(args, spatial)
    strides = _ints(args.get("strides", 1), spatial)
    rates = _ints(args.get("dilation_rate", 1), spatial)
    why = _operands(x, f)
    if not why and tf.TensorShape(x.shape).rank != spatial + 2:
        why = f"inputs of rank {tf.TensorShape(x.shape).rank} for a {spatial}-D kernel"
    elif not why and (not isinstance(padding, str) or padding.lower() not in ("valid", "same")):
        why = f"padding={padding!r}"
    elif not why and data_format is None:
        why = f"data_format={args.get('data_format')!r}"
    elif not why and (strides is None or rates is None):
        why = f"strides={args.get('strides')!r}, dilation_rate={args.get('dilation_rate')!r}"
    return size, data_format, padding, strides, rates, why


def _keras_conv(original):
    """keras.ops.conv: bigconvNd, groups from the channels as Keras' own."""
    def read(args, options):
        size, data_format, padding, strides, rates, why = _keras_common(args)
        channels = None if why else args["inputs"].shape[data_format.index("C")]
        if not why and max(strides) > 1 and max(rates) > 1:
            why = "strides with dilation_rate, which TensorFlow's convolution refuses"
        elif not why and channels is not None and channels % args["kernel"].shape[-2]:
            why = "input channels that are not a multiple of the kernel's"
        if why:
            return _Call(size, reason=why)
        x, f = args["inputs"], args["kernel"]

        def run():
            y = _BIGCONV[len(size)](x, f, list(strides), padding.upper(), data_format,
                                    list(rates), **options)
            if y.shape.is_fully_defined() and not y.shape.num_elements() and (
                    tf.TensorShape(x.shape).num_elements()):
                with _bypassed():
                    return original(**args)  # Keras' own error for an empty output
            return y
        return _Call(size, run=run)
    return read


def _keras_depthwise(args, options):
    """keras.ops.depthwise_conv: tfbigconv.depthwise_conv2d; 1-D as 2-D of height 1,
    as Keras runs it; strides with dilations by Keras' own decomposition (delegated)."""
    size, data_format, padding, strides, rates, why = _keras_common(args)
    x, f = args.get("inputs"), args.get("kernel")
    if not why and len(size) == 3:
        why = "a 3-D depthwise kernel, which Keras refuses"
    elif not why and x.shape[data_format.index("C")] not in (None, f.shape[-2]):
        why = "input channels that differ from the kernel's"
    if why:
        return _Call(size, reason=why)
    if max(strides) > 1 and max(rates) > 1:
        return _Call(size, delegate=True)
    first = data_format.startswith("NC")
    fmt = "NCHW" if first else "NHWC"
    if len(size) == 1:  # height 1
        strides, rates, at = (1, *strides), (1, *rates), 2 if first else 1
    op_strides = [1, 1, *strides] if first else [1, *strides, 1]

    def run():
        if len(size) == 2:
            return depthwise_conv2d(x, f, op_strides, padding.upper(), fmt, list(rates),
                                    **options)
        y = depthwise_conv2d(tf.expand_dims(x, at), tf.expand_dims(f, 0), op_strides,
                             padding.upper(), fmt, list(rates), **options)
        return tf.squeeze(y, [at])
    return _Call(size, run=run)


@dataclasses.dataclass(frozen=True)
class _Target:
    name: str        # as the report names it
    original: typing.Callable
    read: typing.Callable  # (bound arguments, options) -> _Call


def _tf_targets():
    readers = {"conv1d": _tf_conv(bigconv1d, 1), "conv2d": _tf_conv(bigconv2d, 2),
               "conv3d": _tf_conv(bigconv3d, 3), "convolution": _tf_convolution,
               "depthwise_conv2d": _tf_depthwise}
    return {(prefix, n): _Target(f"{prefix}.{n}", getattr(module, n), readers[n])
            for prefix, module in (("tf.nn", tf.nn), ("tf.compat.v1.nn", tf.compat.v1.nn))
            for n in _TF_NAMES}


# TF's functions, read when this module is imported (before any scope replaced them).
_TF_TARGETS = _tf_targets()


def _keras_targets(module):
    conv, depthwise = module.conv, module.depthwise_conv
    return {("keras", "conv"): _Target("keras.ops.conv", conv, _keras_conv(conv)),
            ("keras", "depthwise_conv"): _Target("keras.ops.depthwise_conv", depthwise,
                                                 _keras_depthwise)}


class _bypassed:
    """Calls made inside go to the original functions."""

    def __enter__(self):
        self.token = _bypass.set(True)

    def __exit__(self, *exc):
        _bypass.reset(self.token)


# The frame that tf.autograph.experimental.do_not_convert adds around a function.
_NOT_CONVERTED = tf.autograph.experimental.do_not_convert(lambda: None).__code__


def _from_tfbigconv(frame):
    """Whether the function whose frame called `frame`'s is tfbigconv's own."""
    frame = frame.f_back
    while frame is not None and frame.f_code is _NOT_CONVERTED:
        frame = frame.f_back
    name = frame.f_globals.get("__name__", "") if frame is not None else ""
    return name == "tfbigconv" or name.startswith("tfbigconv.")


def _routing(target):
    """The function that replaces `target.original` while scopes are active."""
    signature = inspect.signature(target.original)

    @tf.autograph.experimental.do_not_convert
    @functools.wraps(target.original)
    def routing(*args, **kwargs):
        scopes = _scopes.get()
        if not scopes or _bypass.get() or _from_tfbigconv(sys._getframe()):
            return target.original(*args, **kwargs)
        try:
            bound = signature.bind(*args, **kwargs).arguments
        except TypeError:  # TF's (Keras') own error
            return target.original(*args, **kwargs)
        return scopes[-1].call(target, bound, args, kwargs)
    return routing


class _Patches:
    """The replaced functions, installed while at least one scope is active."""

    def __init__(self):
        self.lock = threading.Lock()
        self.users = 0
        self.installed = []  # (module, attribute, original, replacement)

    def acquire(self):
        with self.lock:
            if self.users == 0:
                try:
                    self._install()
                except BaseException:
                    self._uninstall()
                    raise
            self.users += 1

    def release(self):
        with self.lock:
            self.users -= 1
            if self.users == 0:
                self._uninstall()

    def _install(self):
        targets = dict(_TF_TARGETS)
        keras_nn = sys.modules.get(_KERAS_MODULE)
        if keras_nn is not None:
            targets.update(_keras_targets(keras_nn))
        by_function = {id(t.original): t for t in targets.values()}
        routers = {}
        modules = [(name, m) for name, m in list(sys.modules.items())
                   if name.startswith("tensorflow._api.") and name.endswith(".nn")]
        if keras_nn is not None:
            modules.append((_KERAS_MODULE, keras_nn))
        for _, module in modules:
            for attribute in (*_TF_NAMES, "conv", "depthwise_conv"):
                target = by_function.get(id(getattr(module, attribute, None)))
                if target is None:
                    continue
                if id(target) not in routers:
                    routers[id(target)] = _routing(target)
                setattr(module, attribute, routers[id(target)])
                self.installed.append((module, attribute, target.original,
                                       routers[id(target)]))

    def _uninstall(self):
        for module, attribute, original, replacement in reversed(self.installed):
            if getattr(module, attribute, None) is replacement:
                setattr(module, attribute, original)
        self.installed = []


_PATCHES = _Patches()


class route:
    """A scope in which raw convolution calls with large filters run on tfbigconv.

        with tfbigconv.route(min_kernel_size=15) as routed:
            model.fit(x, y)          # traced here: its large convolutions are ours
        print(routed)                # what was routed, and what was not, and why

    Inside it, `tf.nn.conv1d`, `conv2d`, `conv3d`, `convolution` and
    `depthwise_conv2d` (also as `tf.compat.v1.nn.*`), `keras.ops.conv` and
    `keras.ops.depthwise_conv` (so Keras 3's own convolution layers too) and
    tf_keras' `backend.conv1d`, `conv2d`, `conv3d` and `depthwise_conv2d` (through
    the tf.nn functions they call) run on `bigconv1d`/`bigconv2d`/`bigconv3d` and
    `depthwise_conv2d` when the filter is at least `min_kernel_size`, with the same
    arguments and gradients. Other calls run TensorFlow's (Keras') own function,
    unchanged: smaller filters, filters whose size is not known when the op is
    built, dtypes tfbigconv does not run (int32), and argument forms route does not
    translate (the report says which). Outside the scope nothing changes.

    It acts when ops are built: eagerly, and while a function is traced inside it
    (`model.fit`, `model.predict`, a `tf.function`, a TF1 graph, `model.export`;
    with `tfbigconv.portable()` around an export, the routed convolutions trace as
    stock TensorFlow ops). A function traced before entering keeps its trace (TF's
    ops), also a Keras model's train or predict function made by an earlier
    `fit`/`predict` call; a function traced inside keeps our ops after the scope
    exits. Only names looked up at call time are reached: a function bound at
    import (`from tensorflow.nn import conv2d`, `tensorflow.python.ops.nn_ops`,
    `tf.raw_ops`) and tf_keras layers made of tf.nn calls on symbolic tensors
    (TFOpLambda) keep TF's op. Calls made by tfbigconv itself never route.

    Threads: the functions are replaced process-wide while any scope is active,
    but a call routes only in the thread (or asyncio task, or a copy of the
    context) that entered the scope; other threads, including threads started
    inside the scope, get TensorFlow's own functions. Scopes nest: the innermost
    one's settings apply and it records the calls; on exit the outer one applies
    again. On exit, also by an exception, the last active scope puts TF's and
    Keras' functions back.

    Args:
      min_kernel_size: int, or (height, width): the smallest filter routed, as
        `convert_model` compares it (both height and width; a 1-D filter's length
        against the width; a 3-D filter's depth is not compared). Default 15.
      algorithm, workspace_limit: passed to every routed call (see `bigconv2d`).

    The scope object (what `with` gives) records each large convolution it saw
    once (`report`, a `RouteReport`; `routed` and `missed`
    list `RoutedCall`s with the function, name scope, kernel
    size and, for a missed one, the reason); `str()` of it is a summary. If it saw
    large convolutions and routed none, exiting warns (RuntimeWarning).

    Raises:
      ValueError: a bad `min_kernel_size`, `algorithm` or `workspace_limit` (named).
    """

    def __init__(self, min_kernel_size=15, *, algorithm="auto", workspace_limit=0):
        self.min_kernel_size = large_kernels.min_kernel_size(min_kernel_size)
        algorithm, workspace_limit = check_options(algorithm, workspace_limit)
        self.options = dict(algorithm=algorithm, workspace_limit=workspace_limit)
        self.report = RouteReport(
            f"tfbigconv.route(min_kernel_size={self.min_kernel_size})")
        self._token = None

    @property
    def routed(self):
        return self.report.converted

    @property
    def missed(self):
        return self.report.missed

    def __str__(self):
        return str(self.report)

    __repr__ = __str__

    def __enter__(self):
        if self._token is not None:
            raise RuntimeError("this tfbigconv.route scope is already active; make a new one")
        _PATCHES.acquire()
        self._token = _scopes.set(_scopes.get() + (self,))
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            _scopes.reset(self._token)
        finally:
            self._token = None
            _PATCHES.release()
        message = self.report.warning()
        if message and exc_type is None:
            warnings.warn(message, RuntimeWarning, stacklevel=2)
        return False

    def call(self, target, bound, args, kwargs):
        """One call of a replaced function inside this scope."""
        read = target.read(bound, self.options)
        size = read.kernel_size
        if size and not large_kernels.is_large(size, self.min_kernel_size):
            return target.original(*args, **kwargs)
        if read.delegate:
            return target.original(*args, **kwargs)
        where = tf.get_current_name_scope()
        self.report.add(RoutedCall(
            target.name, where, size, read.run is not None, read.reason))
        with _bypassed():
            return read.run() if read.run is not None else target.original(*args, **kwargs)

"""TensorFlow's convolution on the pure-TF path, for channels-last operands of any
rank: under XLA, whose convolution has groups, dilations and their gradients, TF's
op (`tf_convolution`); outside it, composed of ops whose gradients TF's CPU kernels
have on every host (`composed_conv`)."""
import math

import tensorflow as tf

from tfbigconv.pure_tf.plans import pads_1d


def in_xla():
    """True while a function XLA compiles is traced (tf.function(jit_compile=True),
    a Keras model compiled with jit_compile=True)."""
    from tensorflow.python.ops import control_flow_util  # TF's own check for XLA contexts
    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


def tf_convolution(x, f, strides, padding, pairs, dilations):
    """TensorFlow's convolution of channels-last x (`strides`, `dilations`, `pairs`:
    spatial only). Under XLA in 2-D: `_xla_conv2d`. Otherwise `composed_conv`, in
    3-D under XLA too: TF 2.21's shape function of a dilated Conv3D in a graph is
    wrong (it shifts the dilations by one dimension), which breaks its gradient."""
    if in_xla() and len(strides) == 2:
        return _xla_conv2d(x, f, strides, padding, pairs, dilations)
    return composed_conv(x, f, strides, padding, pairs, dilations)


def _xla_conv2d(x, f, strides, padding, pairs, dilations):
    """tf.nn.depthwise_conv2d for depthwise filters where it takes the strides and
    dilations (XLA runs it well), else tf.nn.conv2d, grouped where the filter is."""
    cin = tf.compat.dimension_value(x.shape[3]) if x.shape.rank == 4 else None
    kh, kw, cig, cout = f.shape.as_list() if f.shape.rank == 4 else [None] * 4
    pad = [[0, 0], list(pairs[0]), list(pairs[1]), [0, 0]] if padding == "EXPLICIT" else padding
    stride2, rate2 = tuple(strides), tuple(dilations)
    depthwise = (cig == 1 and cin is not None and cin > 1 and cout is not None and
                 cout % cin == 0 and None not in (kh, kw))
    # tf.nn.depthwise_conv2d takes equal strides, and strides or dilations, not both.
    if (depthwise and stride2[0] == stride2[1] and (stride2 == (1, 1) or rate2 == (1, 1)) and
            padding != "EXPLICIT"):
        fd = tf.reshape(f, [kh, kw, cin, cout // cin])
        return tf.nn.depthwise_conv2d(x, fd, [1, stride2[0], stride2[1], 1], padding,
                                      dilations=rate2)
    return tf.nn.conv2d(x, f, [1, *strides, 1], pad, dilations=[1, *dilations, 1])


def composed_conv(x, f, strides, padding, pairs, dilations):
    """tf.nn.conv2d (conv3d) of channels-last x with 2 (3) spatial dimensions,
    from ops with CPU gradients on every host: TF's own CPU kernels have no
    grouped gradient, no dilated gradient and no dilated Conv3D, and oneDNN's
    grouped gradient fails with explicit padding; and TF 2.21's shape function
    of a dilated Conv3D in a graph is wrong. So, unless the filter is neither
    grouped nor dilated (then TF's op with its padding): the padding as tf.pad;
    a dilation by strided slicing (where the stride is a multiple of it) or by
    space-to-batch (tf.nn.with_space_to_batch, as tf.nn.depthwise_conv2d does:
    the undilated convolution of each phase, so the dilated convolution's work
    and memory, where a zero-dilated filter would multiply both by the product
    of the dilations); `_grouped_conv`. `strides`, `dilations`, `pairs`: spatial
    only. float16 and bfloat16 are computed in float32, as the FFT and our
    kernels do (TF's CPU kernels may accumulate in half precision)."""
    if x.dtype in (tf.float16, tf.bfloat16):
        y = composed_conv(tf.cast(x, tf.float32), tf.cast(f, tf.float32), strides, padding,
                          pairs, dilations)
        return tf.cast(y, x.dtype)
    rank = len(strides)
    if _groups(x, f, rank) == 1 and set(dilations) == {1} and (rank == 2 or padding != "EXPLICIT"):
        # TF's own op with its padding: tf.nn.conv2d's (conv3d's) numbers, to the bit
        pad = [[0, 0], *map(list, pairs), [0, 0]] if padding == "EXPLICIT" else padding
        return (tf.nn.conv2d if rank == 2 else tf.nn.conv3d)(x, f, [1, *strides, 1], pad)
    x = _pad_spatial(x, f, strides, padding, pairs, dilations)
    strides, dilations = list(strides), list(dilations)
    for i, (s, d) in enumerate(zip(strides, dilations)):
        if d > 1 and s % d == 0:  # the taps and the strides fall on every d-th row only
            x = x[(slice(None),) * (i + 1) + (slice(None, None, d),)]
            strides[i], dilations[i] = s // d, 1
    if all(d == 1 for d in dilations):
        return _grouped_conv(x, f, strides)
    inner = [s if d == 1 else 1 for s, d in zip(strides, dilations)]
    y = tf.nn.with_space_to_batch(x, dilations, "VALID",
                                  lambda xb, _rank, _padding: _grouped_conv(xb, f, inner))
    if any(s > 1 and d > 1 for s, d in zip(strides, dilations)):  # then every s-th output
        y = y[(slice(None),) + tuple(slice(None, None, s if d > 1 else 1)
                                     for s, d in zip(strides, dilations))]
    return y


def _pad_spatial(x, f, strides, padding, pairs, dilations):
    """x with SAME's (or the explicit pairs') zeros around its spatial dimensions,
    so that a VALID convolution follows. Sizes unknown when the graph is built
    are padded as TensorFlow's SAME pads them, by graph arithmetic."""
    if padding == "VALID":
        return x
    rank = len(strides)
    pads = [list(p) for p in pairs] if padding == "EXPLICIT" else []
    for i in range(rank if padding == "SAME" else 0):
        size = tf.compat.dimension_value(x.shape[i + 1]) if x.shape.rank else None
        k = tf.compat.dimension_value(f.shape[i]) if f.shape.rank else None
        if size is not None and k is not None:
            pads.append(list(pads_1d(size, k, strides[i], dilations[i], "SAME", None)[:2]))
            continue
        size = tf.shape(x)[i + 1] if size is None else size
        k = tf.shape(f)[i] if k is None else k
        out = (size + strides[i] - 1) // strides[i]
        total = tf.maximum((out - 1) * strides[i] + (k - 1) * dilations[i] + 1 - size, 0)
        pads.append([total // 2, total - total // 2])
    if all(isinstance(v, int) and v == 0 for pair in pads for v in pair):
        return x
    return tf.pad(x, [[0, 0], *pads, [0, 0]])


def _grouped_conv(x, f, strides):
    """VALID, undilated tf.nn.conv2d (conv3d) of channels-last x. Grouped filters:
    one op under XLA, whose convolution has groups; outside it one per group, or
    tf.nn.depthwise_conv2d for a depthwise 2-D filter (one op, equal strides:
    their gcd, then a slice)."""
    rank = len(strides)
    conv = tf.nn.conv2d if rank == 2 else tf.nn.conv3d
    groups, full = _groups(x, f, rank), [1, *strides, 1]
    if groups == 1 or in_xla():
        return conv(x, f, full, "VALID")
    if rank == 2 and f.shape[2] == 1 and f.shape.is_fully_defined():
        g, cin, cout = math.gcd(*strides), x.shape[-1], f.shape[-1]
        fd = tf.reshape(f, [*f.shape.as_list()[:2], cin, cout // cin])
        y = tf.nn.depthwise_conv2d(x, fd, [1, g, g, 1], "VALID")
        return y if strides == [g, g] else y[:, ::strides[0] // g, ::strides[1] // g]
    xs, fs = tf.split(x, groups, axis=-1), tf.split(f, groups, axis=-1)
    return tf.concat([conv(a, b, full, "VALID") for a, b in zip(xs, fs)], axis=-1)


def _groups(x, f, rank):
    """Groups of channels-last x and filter f (1 where the channels are not known)."""
    cin = tf.compat.dimension_value(x.shape[-1]) if x.shape.rank else None
    cig = tf.compat.dimension_value(f.shape[rank]) if f.shape.rank == rank + 2 else None
    return cin // cig if cin and cig else 1

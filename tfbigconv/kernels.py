"""TensorFlow's own convolution kernels as ops, each told which kernel to run
(3-D: Conv3D and its gradients, with explicit padding as tf.pad or a crop).

A depthwise filter [KH, KW, 1, C*m] is TF's [KH, KW, C, m]: output channel
c*m + j belongs to group c in both. `depthwise` says whether a pass runs
DepthwiseConv2dNative (with dilations: as tf.nn.depthwise_conv2d runs them)
or Conv2D; planning.tf_rules decides it. Our own kernels are the ops of
tfbigconv._native.
"""
import tensorflow as tf

from tfbigconv import arguments

# The attributes TensorFlow's own Conv2D ops share with ours, and all of ours.
TF_ATTRS = ("strides", "padding", "explicit_paddings", "data_format", "dilations")
ATTRS = TF_ATTRS + ("algorithm", "workspace_limit_bytes")


def tf_attrs(a):
    """The attributes of TensorFlow's ops among `a` (ours)."""
    return {k: a[k] for k in TF_ATTRS}


def conv3d(a):
    """Whether attributes `a` (ours or TF's) are run by TF's Conv3D ops (3 spatial
    dimensions), which take no explicit padding and have no depthwise kernel."""
    return arguments.spatial_dims(a["data_format"]) == 3


def in_depth(shape, data_format):
    shape = tf.TensorShape(shape)
    return shape[-1 if data_format in ("NHWC", "NDHWC") else 1]


def depthwise_filter_shape(depth, f_shape):
    kh, kw, _, out = tf.TensorShape(f_shape).as_list()
    return [kh, kw, depth, out // depth]


def depthwise_filter(w, depth):
    """A depthwise filter [KH, KW, 1, C*m] as TF's [KH, KW, C, m], also where its
    shape is known only when the graph runs."""
    if w.shape.is_fully_defined():
        return tf.reshape(w, depthwise_filter_shape(depth, w.shape))
    s = tf.shape(w)
    return tf.reshape(w, tf.stack([s[0], s[1], depth, s[3] // depth]))


def _spatial(x):
    """An NHWC tensor's height and width: static where known (the results keep
    their static shape), else a tensor."""
    hw = x.shape[1:3]
    return hw.as_list() if hw.is_fully_defined() else tf.shape(x)[1:3]


def _space_to_batch(a, f_shape, input_hw):
    """How tf.nn.depthwise_conv2d runs dilations (nn_ops.with_space_to_batch), for
    NHWC at stride 1: the input padded as the convolution pads it, then up to a
    multiple of the dilations, becomes dh*dw undilated images (SpaceToBatchND);
    the kernel runs VALID on them; BatchToSpaceND crops the result. Where all
    three passes run it and both gradients are planned "tf"
    (tf_rules.uses_depthwise_kernel), TF's registered gradients reuse the
    forward's copy of the input, as tf.nn.depthwise_conv2d's do. Returns
    (block, paddings, crops, undilated attrs)."""
    block = a["dilations"][1:3]
    if a["padding"] == "EXPLICIT":
        base = [a["explicit_paddings"][2:4], a["explicit_paddings"][4:6]]
    elif a["padding"] == "SAME":  # stride 1: (K - 1) * d in all, the odd one after
        extra = [(k - 1) * d for k, d in zip(f_shape[:2], block)]
        base = [[e // 2, e - e // 2] for e in extra]
    else:
        base = [[0, 0], [0, 0]]
    # The twin of plan.cc's TfSpaceToBatchBytes padding, which counts these copies.
    paddings, crops = tf.required_space_to_batch_paddings(input_hw, block, base_paddings=base)
    undilated = dict(tf_attrs(a), padding="VALID", explicit_paddings=[], dilations=[1, 1, 1, 1])
    return block, paddings, crops, undilated


def _conv3d_attrs(a):
    """TF's Conv3D ops' attributes (they have no explicit padding: _explicit_pairs)."""
    return dict(strides=a["strides"], padding="VALID" if a["padding"] == "EXPLICIT"
                else a["padding"], data_format=a["data_format"], dilations=a["dilations"])


def _explicit_pairs(a):
    """[before, after] per dimension of explicit padding, which TF's Conv3D ops run
    as tf.pad (or, for the input gradient, a crop) around a VALID convolution."""
    p = a["explicit_paddings"]
    return [p[i:i + 2] for i in range(0, len(p), 2)] if a["padding"] == "EXPLICIT" else None


def tf_forward(x, w, a, depthwise, per_group=False):
    """TF's forward kernel. per_group: a grouped Conv2D as one Conv2D per group
    (split, convolve, concatenate), as TF's Eigen kernel runs it, where a
    BiasAdd after it would fuse into a kernel without groups
    (planning.tf_rules.grouped_conv2d_fusion_fails); nothing fuses into the
    concatenation, and each group's Conv2D and gradients are ungrouped."""
    if conv3d(a):
        pairs = _explicit_pairs(a)
        x = tf.pad(x, pairs) if pairs else x
        return tf.raw_ops.Conv3D(input=x, filter=w, **_conv3d_attrs(a))
    if not depthwise and per_group:
        axis = 3 if a["data_format"] == "NHWC" else 1
        groups = in_depth(x.shape, a["data_format"]) // w.shape[2]
        ys = [tf.raw_ops.Conv2D(input=xg, filter=wg, **tf_attrs(a))
              for xg, wg in zip(tf.split(x, groups, axis=axis), tf.split(w, groups, axis=3))]
        return tf.concat(ys, axis=axis)
    if not depthwise:
        return tf.raw_ops.Conv2D(input=x, filter=w, **tf_attrs(a))
    w = depthwise_filter(w, in_depth(x.shape, a["data_format"]))
    if all(d == 1 for d in a["dilations"]):
        return tf.raw_ops.DepthwiseConv2dNative(input=x, filter=w, **tf_attrs(a))
    block, paddings, crops, undilated = _space_to_batch(a, w.shape, _spatial(x))
    y = tf.raw_ops.DepthwiseConv2dNative(input=tf.space_to_batch_nd(x, block, paddings),
                                         filter=w, **undilated)
    return tf.batch_to_space(y, block, crops)


def tf_backprop_input(input_sizes, w, dy, a, depth, depthwise):
    if conv3d(a):
        pairs = _explicit_pairs(a)
        if not pairs:
            return tf.raw_ops.Conv3DBackpropInputV2(input_sizes=input_sizes, filter=w,
                                                    out_backprop=dy, **_conv3d_attrs(a))
        input_sizes = tf.cast(input_sizes, tf.int32)
        dx = tf.raw_ops.Conv3DBackpropInputV2(
            input_sizes=input_sizes + tf.reduce_sum(pairs, axis=1), filter=w, out_backprop=dy,
            **_conv3d_attrs(a))
        return tf.slice(dx, [p[0] for p in pairs], input_sizes)
    if not depthwise:
        return tf.raw_ops.Conv2DBackpropInput(input_sizes=input_sizes, filter=w, out_backprop=dy,
                                              **tf_attrs(a))
    w = depthwise_filter(w, depth)
    if all(d == 1 for d in a["dilations"]):
        return tf.raw_ops.DepthwiseConv2dNativeBackpropInput(
            input_sizes=input_sizes, filter=w, out_backprop=dy, **tf_attrs(a))
    # The gradients of SpaceToBatchND and BatchToSpaceND are each other.
    static = tf.get_static_value(input_sizes)
    input_sizes = tf.cast(input_sizes, tf.int32)
    block, paddings, crops, undilated = _space_to_batch(
        a, w.shape, list(static[1:3]) if static is not None else input_sizes[1:3])
    padded = input_sizes[1:3] + tf.reduce_sum(paddings, axis=1)
    sizes = tf.concat([input_sizes[:1] * tf.reduce_prod(block), padded // block,
                       input_sizes[3:]], axis=0)
    dx = tf.raw_ops.DepthwiseConv2dNativeBackpropInput(
        input_sizes=sizes, filter=w, out_backprop=tf.space_to_batch_nd(dy, block, crops),
        **undilated)
    return tf.batch_to_space(dx, block, paddings)


def tf_backprop_filter(x, f_shape, dy, a, depthwise):
    if conv3d(a):
        pairs = _explicit_pairs(a)
        return tf.raw_ops.Conv3DBackpropFilterV2(input=tf.pad(x, pairs) if pairs else x,
                                                 filter_sizes=f_shape, out_backprop=dy,
                                                 **_conv3d_attrs(a))
    if not depthwise:
        return tf.raw_ops.Conv2DBackpropFilter(input=x, filter_sizes=f_shape, out_backprop=dy,
                                               **tf_attrs(a))
    c = in_depth(x.shape, a["data_format"])
    sizes = depthwise_filter_shape(c, f_shape)
    if all(d == 1 for d in a["dilations"]):
        dw = tf.raw_ops.DepthwiseConv2dNativeBackpropFilter(
            input=x, filter_sizes=sizes, out_backprop=dy, **tf_attrs(a))
    else:
        block, paddings, crops, undilated = _space_to_batch(a, f_shape, _spatial(x))
        dw = tf.raw_ops.DepthwiseConv2dNativeBackpropFilter(
            input=tf.space_to_batch_nd(x, block, paddings), filter_sizes=sizes,
            out_backprop=tf.space_to_batch_nd(dy, block, crops), **undilated)
    return tf.reshape(dw, f_shape)

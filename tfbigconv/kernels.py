"""TensorFlow's own convolution kernels as ops, each told which kernel to run
(3-D: Conv3D and its gradients, with explicit padding as tf.pad or a crop).

A depthwise filter [KH, KW, 1, C*m] is TF's [KH, KW, C, m]: output channel
c*m + j belongs to group c in both. `depthwise` says whether a pass runs
DepthwiseConv2dNative (with dilations: as tf.nn.depthwise_conv2d runs them)
or Conv2D; planning.tf_rules decides it. Every function takes the
convolution's arguments.ConvSpec (`spec`), whose in_depth the depthwise and
grouped kernels read. Our own kernels are the ops of tfbigconv._native.
"""
import tensorflow as tf


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


def _space_to_batch(spec, f_shape, input_hw):
    """How tf.nn.depthwise_conv2d runs dilations (nn_ops.with_space_to_batch), for
    NHWC at stride 1: the input padded as the convolution pads it, then up to a
    multiple of the dilations, becomes dh*dw undilated images (SpaceToBatchND);
    the kernel runs VALID on them; BatchToSpaceND crops the result. Where all
    three passes run it and both gradients are planned "tf"
    (tf_rules.uses_depthwise_kernel), TF's registered gradients reuse the
    forward's copy of the input, as tf.nn.depthwise_conv2d's do. Returns
    (block, paddings, crops, undilated attrs)."""
    block = list(spec.dilations[1:3])
    if spec.explicit:
        base = [list(spec.explicit_paddings[2:4]), list(spec.explicit_paddings[4:6])]
    elif spec.padding == "SAME":  # stride 1: (K - 1) * d in all, the odd one after
        extra = [(k - 1) * d for k, d in zip(f_shape[:2], block)]
        base = [[e // 2, e - e // 2] for e in extra]
    else:
        base = [[0, 0], [0, 0]]
    # The twin of plan.cc's TfSpaceToBatchBytes padding, which counts these copies.
    paddings, crops = tf.required_space_to_batch_paddings(input_hw, block, base_paddings=base)
    undilated = dict(spec.tf_attrs(), padding="VALID", explicit_paddings=[],
                     dilations=[1, 1, 1, 1])
    return block, paddings, crops, undilated


def _conv3d_attrs(spec):
    """TF's Conv3D ops' attributes (they have no explicit padding: _explicit_pairs)."""
    return dict(strides=list(spec.strides), padding="VALID" if spec.explicit else spec.padding,
                data_format=spec.data_format, dilations=list(spec.dilations))


def _explicit_pairs(spec):
    """[before, after] per dimension of explicit padding, which TF's Conv3D ops run
    as tf.pad (or, for the input gradient, a crop) around a VALID convolution."""
    p = list(spec.explicit_paddings)
    return [p[i:i + 2] for i in range(0, len(p), 2)] if spec.explicit else None


def tf_forward(x, w, spec, depthwise, per_group=False):
    """TF's forward kernel. per_group: a grouped Conv2D as one Conv2D per group
    (split, convolve, concatenate), as TF's Eigen kernel runs it, where a
    BiasAdd after it would fuse into a kernel without groups
    (planning.tf_rules.grouped_conv2d_fusion_fails); nothing fuses into the
    concatenation, and each group's Conv2D and gradients are ungrouped."""
    if spec.conv3d:
        pairs = _explicit_pairs(spec)
        x = tf.pad(x, pairs) if pairs else x
        return tf.raw_ops.Conv3D(input=x, filter=w, **_conv3d_attrs(spec))
    if not depthwise and per_group:
        axis = 3 if spec.channels_last else 1
        ys = [tf.raw_ops.Conv2D(input=xg, filter=wg, **spec.tf_attrs())
              for xg, wg in zip(tf.split(x, spec.groups, axis=axis),
                                tf.split(w, spec.groups, axis=3))]
        return tf.concat(ys, axis=axis)
    if not depthwise:
        return tf.raw_ops.Conv2D(input=x, filter=w, **spec.tf_attrs())
    w = depthwise_filter(w, spec.in_depth)
    if not spec.dilated:
        return tf.raw_ops.DepthwiseConv2dNative(input=x, filter=w, **spec.tf_attrs())
    block, paddings, crops, undilated = _space_to_batch(spec, w.shape, _spatial(x))
    y = tf.raw_ops.DepthwiseConv2dNative(input=tf.space_to_batch_nd(x, block, paddings),
                                         filter=w, **undilated)
    return tf.batch_to_space(y, block, crops)


def tf_backprop_input(input_sizes, w, dy, spec, depthwise):
    if spec.conv3d:
        pairs = _explicit_pairs(spec)
        if not pairs:
            return tf.raw_ops.Conv3DBackpropInputV2(input_sizes=input_sizes, filter=w,
                                                    out_backprop=dy, **_conv3d_attrs(spec))
        input_sizes = tf.cast(input_sizes, tf.int32)
        dx = tf.raw_ops.Conv3DBackpropInputV2(
            input_sizes=input_sizes + tf.reduce_sum(pairs, axis=1), filter=w, out_backprop=dy,
            **_conv3d_attrs(spec))
        return tf.slice(dx, [p[0] for p in pairs], input_sizes)
    if not depthwise:
        return tf.raw_ops.Conv2DBackpropInput(input_sizes=input_sizes, filter=w, out_backprop=dy,
                                              **spec.tf_attrs())
    w = depthwise_filter(w, spec.in_depth)
    if not spec.dilated:
        return tf.raw_ops.DepthwiseConv2dNativeBackpropInput(
            input_sizes=input_sizes, filter=w, out_backprop=dy, **spec.tf_attrs())
    # The gradients of SpaceToBatchND and BatchToSpaceND are each other.
    static = tf.get_static_value(input_sizes)
    input_sizes = tf.cast(input_sizes, tf.int32)
    block, paddings, crops, undilated = _space_to_batch(
        spec, w.shape, list(static[1:3]) if static is not None else input_sizes[1:3])
    padded = input_sizes[1:3] + tf.reduce_sum(paddings, axis=1)
    sizes = tf.concat([input_sizes[:1] * tf.reduce_prod(block), padded // block,
                       input_sizes[3:]], axis=0)
    dx = tf.raw_ops.DepthwiseConv2dNativeBackpropInput(
        input_sizes=sizes, filter=w, out_backprop=tf.space_to_batch_nd(dy, block, crops),
        **undilated)
    return tf.batch_to_space(dx, block, paddings)


def tf_backprop_filter(x, f_shape, dy, spec, depthwise):
    if spec.conv3d:
        pairs = _explicit_pairs(spec)
        return tf.raw_ops.Conv3DBackpropFilterV2(input=tf.pad(x, pairs) if pairs else x,
                                                 filter_sizes=f_shape, out_backprop=dy,
                                                 **_conv3d_attrs(spec))
    if not depthwise:
        return tf.raw_ops.Conv2DBackpropFilter(input=x, filter_sizes=f_shape, out_backprop=dy,
                                               **spec.tf_attrs())
    sizes = depthwise_filter_shape(spec.in_depth, f_shape)
    if not spec.dilated:
        dw = tf.raw_ops.DepthwiseConv2dNativeBackpropFilter(
            input=x, filter_sizes=sizes, out_backprop=dy, **spec.tf_attrs())
    else:
        block, paddings, crops, undilated = _space_to_batch(spec, f_shape, _spatial(x))
        dw = tf.raw_ops.DepthwiseConv2dNativeBackpropFilter(
            input=tf.space_to_batch_nd(x, block, paddings), filter_sizes=sizes,
            out_backprop=tf.space_to_batch_nd(dy, block, crops), **undilated)
    return tf.reshape(dw, f_shape)

"""Large-kernel architectures written as their authors write them, for bench_models.py.

Custom Layer classes for the blocks, convolutions as sublayers inside them,
Sequentials nested in custom layers, raw tf.nn / tf.signal calls in call(): the
structure a public Keras port has, which tfbigconv must reach without edits.

- RepLKNet (Ding et al., CVPR 2022, "Scaling up your kernels to 31x31"): stem,
  4 stages of RepLKBlock + ConvFFN pairs joined by transitions, BN + pool + Dense
  head. A LargeConv holds a Sequential(DepthwiseConv2D k x k, BN) and a parallel
  Sequential(DepthwiseConv2D 5x5, BN); `reparameterize(model)` merges both with
  their BN into one k x k kernel and bias, after which LargeConv.call runs
  `tf.nn.depthwise_conv2d` itself (Keras 2's backend.depthwise_conv2d). Drop path
  is left out (no randomness in a timed step).
- A Hyena block (Poli et al. 2023): LayerNorm, in-projection to 3d, a short
  causal depthwise conv, gating, a causal depthwise long convolution with a
  filter as long as the sequence (explicit and trainable here, with Hyena's
  exponential decay window), gating, out-projection, residual. `long_conv`
  picks how the long convolution is computed: "fft" as Hyena's reference code
  does (rfft of length 2L, multiply, irfft, crop) with tf.signal, or "bigconv"
  with tfbigconv.bigconv1d and CAUSAL padding.
- A 3D UX-Net block (Lee et al., ICLR 2023): depthwise k^3 convolution (a
  Conv3D with groups=channels: Keras has no DepthwiseConv3D), LayerNorm,
  pointwise MLP (4x), layer scale, residual.

Every builder takes the Keras module (keras, or tf_keras) and returns a built
Functional model. All call() code uses TensorFlow ops, so both flavours work.
"""
import functools

import numpy as np
import tensorflow as tf

REPLKNET_31B = dict(kernels=(31, 29, 27, 13), widths=(128, 256, 512, 1024),
                    depths=(2, 2, 18, 2), small_kernel=5, ffn_ratio=4, classes=1000)
# A tiny RepLKNet for tests and --quick: the same kernels, few blocks, few channels.
REPLKNET_TINY = dict(kernels=(31, 29, 27, 13), widths=(8, 16, 32, 64), depths=(1, 1, 2, 1),
                     small_kernel=5, ffn_ratio=4, classes=10)


@functools.lru_cache(maxsize=None)
def layers_for(keras):
    """The custom layer classes, defined on this Keras flavour's Layer."""
    L = keras.layers

    def conv_bn(filters, kernel_size, strides=1, depthwise=False, name=None):
        conv = (L.DepthwiseConv2D(kernel_size, strides, padding="same", use_bias=False)
                if depthwise else
                L.Conv2D(filters, kernel_size, strides, padding="same", use_bias=False))
        return keras.Sequential([conv, L.BatchNormalization()], name=name)

    def conv_bn_relu(filters, kernel_size, strides=1, depthwise=False, name=None):
        seq = conv_bn(filters, kernel_size, strides, depthwise, name)
        seq.add(L.ReLU())
        return seq

    def fuse_bn(seq):
        """(kernel, bias) of Sequential(DepthwiseConv2D, BN) in inference mode."""
        conv, bn = seq.layers[0], seq.layers[1]
        std = np.sqrt(bn.moving_variance.numpy() + bn.epsilon)
        scale = bn.gamma.numpy() / std
        kernel = conv.weights[0].numpy() * scale[None, None, :, None]
        return kernel, bn.beta.numpy() - bn.moving_mean.numpy() * scale

    class LargeConv(L.Layer):
        """RepLKNet's ReparamLargeKernelConv: depthwise k x k + BN, plus a parallel
        depthwise small x small + BN; merge() folds both into one kernel and bias."""

        def __init__(self, channels, kernel_size, small_kernel=5, **kwargs):
            super().__init__(**kwargs)
            self.channels, self.kernel_size, self.small_kernel = channels, kernel_size, small_kernel
            self.lkb_origin = conv_bn(channels, kernel_size, depthwise=True, name="lkb_origin")
            self.small_conv = conv_bn(channels, small_kernel, depthwise=True, name="small_conv")
            self.merged = None  # (kernel [k, k, C, 1], bias [C]) once merged

        def call(self, x, training=None):
            if self.merged is not None:
                kernel, bias = self.merged
                return tf.nn.depthwise_conv2d(x, kernel, [1, 1, 1, 1], "SAME") + bias
            return self.lkb_origin(x, training=training) + self.small_conv(x, training=training)

        def merge(self):
            kernel, bias = fuse_bn(self.lkb_origin)
            small, small_bias = fuse_bn(self.small_conv)
            p = (self.kernel_size - self.small_kernel) // 2
            kernel = kernel + np.pad(small, ((p, p), (p, p), (0, 0), (0, 0)))
            self.merged = (tf.constant(kernel), tf.constant(bias + small_bias))

        def get_config(self):
            return {**super().get_config(), "channels": self.channels,
                    "kernel_size": self.kernel_size, "small_kernel": self.small_kernel}

    class RepLKBlock(L.Layer):
        def __init__(self, channels, kernel_size, small_kernel=5, **kwargs):
            super().__init__(**kwargs)
            self.channels, self.kernel_size, self.small_kernel = channels, kernel_size, small_kernel
            self.pre_bn = L.BatchNormalization()
            self.pw1 = conv_bn_relu(channels, 1, name="pw1")
            self.large_kernel = LargeConv(channels, kernel_size, small_kernel, name="large_kernel")
            self.pw2 = conv_bn(channels, 1, name="pw2")

        def call(self, x, training=None):
            out = self.pre_bn(x, training=training)
            out = self.pw1(out, training=training)
            out = tf.nn.relu(self.large_kernel(out, training=training))
            return x + self.pw2(out, training=training)

        def get_config(self):
            return {**super().get_config(), "channels": self.channels,
                    "kernel_size": self.kernel_size, "small_kernel": self.small_kernel}

    class ConvFFN(L.Layer):
        def __init__(self, channels, ratio=4, **kwargs):
            super().__init__(**kwargs)
            self.channels, self.ratio = channels, ratio
            self.preffn_bn = L.BatchNormalization()
            self.pw1 = conv_bn(channels * ratio, 1, name="pw1")
            self.pw2 = conv_bn(channels, 1, name="pw2")

        def call(self, x, training=None):
            out = self.pw1(self.preffn_bn(x, training=training), training=training)
            return x + self.pw2(tf.nn.gelu(out), training=training)

        def get_config(self):
            return {**super().get_config(), "channels": self.channels, "ratio": self.ratio}

    class Stem(L.Layer):
        def __init__(self, channels, **kwargs):
            super().__init__(**kwargs)
            self.channels = channels
            self.blocks = [conv_bn_relu(channels, 3, 2, name="stem0"),
                           conv_bn_relu(channels, 3, 1, depthwise=True, name="stem1"),
                           conv_bn_relu(channels, 1, name="stem2"),
                           conv_bn_relu(channels, 3, 2, depthwise=True, name="stem3")]

        def call(self, x, training=None):
            for block in self.blocks:
                x = block(x, training=training)
            return x

        def get_config(self):
            return {**super().get_config(), "channels": self.channels}

    class Transition(L.Layer):
        def __init__(self, channels, **kwargs):
            super().__init__(**kwargs)
            self.channels = channels
            self.body = keras.Sequential([conv_bn_relu(channels, 1, name="pw"),
                                          conv_bn_relu(channels, 3, 2, depthwise=True, name="dw")])

        def call(self, x, training=None):
            return self.body(x, training=training)

        def get_config(self):
            return {**super().get_config(), "channels": self.channels}

    class HyenaFilter(L.Layer):
        """An explicit long filter [L, d] with Hyena's exponential decay window, and
        the skip weight D [d]."""

        def __init__(self, length, channels, fast_decay=0.3, slow_decay=1.5, **kwargs):
            super().__init__(**kwargs)
            self.length, self.channels = length, channels
            self.fast_decay, self.slow_decay = fast_decay, slow_decay

        def build(self, input_shape=None):
            self.h = self.add_weight(name="h", shape=(self.length, self.channels),
                                     initializer=keras.initializers.RandomNormal(stddev=0.02))
            self.bias = self.add_weight(name="bias", shape=(self.channels,),
                                        initializer="random_normal")
            t = np.linspace(0, 1, self.length, dtype=np.float32)[:, None]
            rate = np.abs(np.log(1e-2)) / np.linspace(self.fast_decay, self.slow_decay,
                                                       self.channels, dtype=np.float32)
            self.decay = tf.constant(np.exp(-t * rate[None, :]), tf.float32)
            self.built = True

        def call(self, inputs=None):
            return self.h * self.decay

        def get_config(self):
            return {**super().get_config(), "length": self.length, "channels": self.channels,
                    "fast_decay": self.fast_decay, "slow_decay": self.slow_decay}

    class HyenaOperator(L.Layer):
        """Order-2 Hyena: in_proj to 3d, short causal conv, v * x1, long conv
        (+ D skip), * x2, out_proj."""

        def __init__(self, channels, length, long_conv="fft", **kwargs):
            super().__init__(**kwargs)
            if long_conv not in ("fft", "bigconv"):
                raise ValueError(f"long_conv must be 'fft' or 'bigconv', got {long_conv!r}")
            self.channels, self.length, self.long_conv = channels, length, long_conv
            self.in_proj = L.Dense(3 * channels, name="in_proj")
            # Hyena's Conv1d(groups=3d, padding=2) cropped to causal; Keras 3's
            # DepthwiseConv1D has no causal padding.
            self.short_filter = keras.Sequential([L.ZeroPadding1D((2, 0)), L.DepthwiseConv1D(3)],
                                                 name="short_filter")
            self.filter_fn = HyenaFilter(length, channels, name="filter_fn")
            self.out_proj = L.Dense(channels, name="out_proj")

        def build(self, input_shape):
            self.in_proj.build(input_shape)
            self.short_filter.build(tuple(input_shape[:-1]) + (3 * self.channels,))
            self.filter_fn.build()
            self.out_proj.build(input_shape)
            self.built = True

        def call(self, u):
            z = self.short_filter(self.in_proj(u))
            x1, x2, v = tf.split(z, 3, axis=-1)
            k = self.filter_fn(None)
            if self.long_conv == "fft":
                y = fft_causal_conv(v * x1, k)
            else:
                y = bigconv_causal_conv(v * x1, k)
            y = y + v * x1 * self.filter_fn.bias
            return self.out_proj(y * x2)

        def get_config(self):
            return {**super().get_config(), "channels": self.channels, "length": self.length,
                    "long_conv": self.long_conv}

    class HyenaBlock(L.Layer):
        def __init__(self, channels, length, long_conv="fft", **kwargs):
            super().__init__(**kwargs)
            self.channels, self.length, self.long_conv = channels, length, long_conv
            self.norm = L.LayerNormalization(epsilon=1e-5)
            self.mixer = HyenaOperator(channels, length, long_conv, name="mixer")

        def build(self, input_shape):
            self.norm.build(input_shape)
            self.mixer.build(input_shape)
            self.built = True

        def call(self, x):
            return x + self.mixer(self.norm(x))

        def get_config(self):
            return {**super().get_config(), "channels": self.channels, "length": self.length,
                    "long_conv": self.long_conv}

    class UXBlock(L.Layer):
        """3D UX-Net's block: depthwise k^3 (Conv3D, groups=channels), LayerNorm,
        Dense 4C, GELU, Dense C, layer scale, residual.

        depthwise="split" computes the depthwise convolution with the same Conv3D's
        weights as one tf.nn.conv3d per channel: the workaround for Keras running a
        grouped Conv3D through XLA on the CPU, which is about 50x slower."""

        def __init__(self, channels, kernel_size=7, layer_scale_init=1e-6,
                     depthwise="grouped", **kwargs):
            super().__init__(**kwargs)
            if depthwise not in ("grouped", "split"):
                raise ValueError(f"depthwise must be 'grouped' or 'split', got {depthwise!r}")
            self.channels, self.kernel_size = channels, kernel_size
            self.layer_scale_init, self.depthwise = layer_scale_init, depthwise
            self.dwconv = L.Conv3D(channels, kernel_size, padding="same", groups=channels,
                                   name="dwconv")
            self.norm = L.LayerNormalization(epsilon=1e-6)
            self.pwconv1 = L.Dense(4 * channels, name="pwconv1")
            self.pwconv2 = L.Dense(channels, name="pwconv2")

        def build(self, input_shape):
            self.dwconv.build(input_shape)
            self.norm.build(input_shape)
            self.pwconv1.build(input_shape)
            self.pwconv2.build(tuple(input_shape[:-1]) + (4 * self.channels,))
            self.gamma = self.add_weight(
                name="gamma", shape=(self.channels,),
                initializer=keras.initializers.Constant(self.layer_scale_init))
            self.built = True

        def call(self, x):
            if self.depthwise == "split":
                kernels = tf.split(self.dwconv.kernel, self.channels, axis=-1)
                out = tf.concat([tf.nn.conv3d(xc, kc, [1] * 5, "SAME") for xc, kc in
                                 zip(tf.split(x, self.channels, axis=-1), kernels)], axis=-1)
                out = self.norm(out + self.dwconv.bias)
            else:
                out = self.norm(self.dwconv(x))
            out = self.pwconv2(tf.nn.gelu(self.pwconv1(out)))
            return x + self.gamma * out

        def get_config(self):
            return {**super().get_config(), "channels": self.channels,
                    "kernel_size": self.kernel_size, "layer_scale_init": self.layer_scale_init,
                    "depthwise": self.depthwise}

    return dict(LargeConv=LargeConv, RepLKBlock=RepLKBlock, ConvFFN=ConvFFN, Stem=Stem,
                Transition=Transition, HyenaFilter=HyenaFilter, HyenaOperator=HyenaOperator,
                HyenaBlock=HyenaBlock, UXBlock=UXBlock)


def fft_causal_conv(u, k):
    """Hyena's fftconv: y[t] = sum_{s <= t} k[t - s] u[s] per channel, by FFTs of
    length 2L. u [B, L, d], k [L, d]."""
    n = 2 * tf.shape(u)[1]
    u_f = tf.signal.rfft(tf.transpose(u, [0, 2, 1]), fft_length=[n])
    k_f = tf.signal.rfft(tf.transpose(k), fft_length=[n])
    y = tf.signal.irfft(u_f * k_f, fft_length=[n])[..., :tf.shape(u)[1]]
    return tf.transpose(y, [0, 2, 1])


def bigconv_causal_conv(u, k):
    """The same causal convolution with tfbigconv.bigconv1d: a depthwise filter
    [L, 1, d], reversed (a convolution layer correlates)."""
    import tfbigconv
    return tfbigconv.bigconv1d(u, tf.reverse(k, [0])[:, None, :], 1, "CAUSAL")


def replknet(keras, image=224, config=REPLKNET_31B, name="replknet"):
    """RepLKNet (31B by default) for image x image x 3 inputs, logits out."""
    lk = layers_for(keras)
    L = keras.layers
    inputs = keras.Input((image, image, 3))
    x = lk["Stem"](config["widths"][0], name="stem")(inputs)
    for stage, (k, width, depth) in enumerate(zip(config["kernels"], config["widths"],
                                                  config["depths"])):
        if stage > 0:
            x = lk["Transition"](width, name=f"transition{stage}")(x)
        for i in range(depth):
            x = lk["RepLKBlock"](width, k, config["small_kernel"], name=f"s{stage}_lk{i}")(x)
            x = lk["ConvFFN"](width, config["ffn_ratio"], name=f"s{stage}_ffn{i}")(x)
    x = L.BatchNormalization(name="norm")(x)
    x = L.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, L.Dense(config["classes"], name="head")(x), name=name)


def reparameterize(model):
    """Merges every LargeConv's branches and BNs (RepLKNet's deploy mode), in place;
    returns how many were merged."""
    large = [layer for layer in model._flatten_layers(include_self=False, recursive=True)
             if type(layer).__name__ == "LargeConv"]
    for layer in large:
        layer.merge()
    return len(large)


def hyena(keras, length=2048, channels=256, long_conv="fft", depth=1, name="hyena"):
    """`depth` Hyena blocks on [length, channels] sequences."""
    lk = layers_for(keras)
    inputs = keras.Input((length, channels))
    x = inputs
    for i in range(depth):
        x = lk["HyenaBlock"](channels, length, long_conv, name=f"block{i}")(x)
    return keras.Model(inputs, x, name=name)


def uxnet(keras, size=48, kernel=13, channels=32, depth=1, layer_scale_init=1e-6,
          depthwise="grouped", name="uxnet"):
    """`depth` 3D UX-Net blocks on size^3 volumes of `channels` channels."""
    lk = layers_for(keras)
    inputs = keras.Input((size, size, size, channels))
    x = inputs
    for i in range(depth):
        x = lk["UXBlock"](channels, kernel, layer_scale_init, depthwise, name=f"block{i}")(x)
    return keras.Model(inputs, x, name=name)

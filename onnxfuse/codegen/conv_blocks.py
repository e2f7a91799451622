"""A Conv lowered as onnxruntime's CPU kernels sum it: in blocks of input channels.

onnxruntime (1.32, x86 with AVX-512) sums a 2-D convolution's products per block of input
channels and then adds the blocks' sums in order: a chain of fused multiply-adds from 0 over the
window rows, columns and the block's channels (channels innermost) per block, the block sums
added one by one, then the bias. Its blocks are 16 channels (its NCHWc layout) when the input
has 16 channels or more, the last block ragged if the count is no multiple of 16, and single
channels below 16 (its NCHW-input kernel: one window sum per channel). Found by emulating
candidates in numpy against onnxruntime: 3, 16, 24, 32 and 48 input channels, bit for bit.

On x86-64 CPUs without AVX-512 (AVX2, and the SSE baseline) MLAS's NCHWc block is 8 channels
(its NchwcBlockSize), and its kernels sum the same way in blocks of 8 (single channels below 8):
each ISA level of a portable build is lowered with its own block (sum_orders.py), bit for bit
with onnxruntime under emulated AVX2 and SSE CPUs (tests/test_sum_orders.py).

On aarch64 MLAS has no NCHWc kernels: onnxruntime's Conv is an im2col product, summed as its
SGEMM sums a product by an unpacked weight. The products come in im2col order (channel, window
row, window column; the column innermost), in blocks of MLAS's K stride (mlas_k_stride: 128, more
for an image of few output pixels), each block a chain of fused multiply-adds from 0, the blocks'
sums added in order, then the bias (`conv2d_in_k_blocks`; under `qemu-aarch64 -cpu neoverse-n1`,
one thread, 3 to 32 input channels, 1x1 and 3x3 windows, bit for bit, where the channel blocks
matched none). With more threads onnxruntime splits an image's pixels among them, and the
stride follows each share: its results then depend on its thread count, which a kernel cannot
know; the kernel gives the one-thread bits. A Conv with a bias whose output only a residual Add
reads is onnxruntime's Conv with a sum input there, summed from the residual (conv2d_with_sum,
conv_sum_input.py).

TVM's conv2d is one chain over every channel and window position. For one block (exactly 16
channels) the order is the same, and the register-tiled schedule (conv_schedule) walks it in
onnxruntime's order; for more blocks, or single-channel ones, this lowering computes the block
sums as a block of their own (`conv2d_block_sums`) and their sum (`conv2d_nchw`), which
conv_schedule tiles together. Every multiply-add of the chain is written so that LLVM fuses the
new product and nothing else (rounded_products.multiply_added). Other convolutions (strides, dilations,
groups, other layouts) keep TVM's lowering.
"""

from __future__ import annotations

import tvm
from tvm import te, topi

from . import sum_orders, tir_walk
from .rounded_products import multiply_added, rounded

BLOCK_SUMS = "conv2d_block_sums"
BLOCKS_SUM = "conv2d_nchw"
CONV_WITH_SUM = "conv2d_with_sum"


def channel_block(channels: int) -> int:
    """Input channels per block onnxruntime sums alone (module doc), for the block in force."""
    block = sum_orders.current().conv_channel_block
    return block if channels >= block else 1


def _out_dtype(attrs) -> str | None:
    """The call's out_dtype, None where it leaves it to the input's ("" or void)."""
    dtype = str(attrs.out_dtype)
    return None if dtype in ("", "void", "None") else dtype


def is_blocked_conv(data: te.Tensor, weights: te.Tensor, attrs) -> bool:
    """Whether the conv2d is one this lowering takes: float32 NCHW/OIHW, one group, stride and
    dilation 1, static channels."""
    if attrs.data_layout != "NCHW" or attrs.kernel_layout != "OIHW":
        return False
    if int(attrs.groups) != 1 or any(int(s) != 1 for s in attrs.strides) or any(int(d) != 1 for d in attrs.dilation):
        return False
    if _out_dtype(attrs) not in (None, "float32") or data.dtype != "float32" or weights.dtype != "float32":
        return False
    channels = tir_walk.static_int(weights.shape[1]) if len(weights.shape) == 4 else None
    return channels is not None and len(data.shape) == 4


# The blocks' sums, each rounded alone before it is added (a one-term block is a bare product).
_rounded_sum = te.comm_reducer(lambda total, block_sum: total + rounded(block_sum),
                               lambda dtype: tvm.tirx.const(0.0, dtype), name="rounded_sum")


def _padded(data: te.Tensor, weights: te.Tensor, padding):
    """(the zero-padded image, the output shape) of a stride-1 conv."""
    top, left, bottom, right = (int(p) for p in padding)
    batch, _, height, width = data.shape
    out_channels, _, rows, cols = weights.shape
    image = topi.nn.pad(data, [0, 0, top, left], [0, 0, bottom, right], name="pad_temp") \
        if (top, left, bottom, right) != (0, 0, 0, 0) else data
    # Simplified, so a symbolic image size gives an output dim the kernel can name (H, not H + 2 - 3 + 1).
    simplify = tvm.sym.Analyzer().simplify
    return image, (batch, out_channels, simplify(height + top + bottom - rows + 1),
                   simplify(width + left + right - cols + 1))


def conv2d_in_blocks(data: te.Tensor, weights: te.Tensor, padding) -> te.Tensor:
    """out[n, k, y, x] = sum over blocks b of (sum over dy, dx, c in b of image * weight), each
    sum from 0 in that order (module doc), whatever the schedule does with the other loops. One
    block is one stage, like TVM's own conv2d_nchw. On aarch64, conv2d_in_k_blocks."""
    channels = int(data.shape[1])
    _, _, rows, cols = weights.shape
    image, out_shape = _padded(data, weights, padding)
    batch = out_shape[0]
    k_block = sum_orders.current().conv_k_block
    if k_block is not None:
        return conv2d_in_k_blocks(image, weights, out_shape, k_block)
    block = channel_block(channels)
    blocks = -(-channels // block)
    dy = te.reduce_axis((0, rows), name="ry")
    dx = te.reduce_axis((0, cols), name="rx")
    if blocks == 1:
        c = te.reduce_axis((0, channels), name="rc")
        return te.compute(out_shape, lambda n, k, y, x: multiply_added(
            image[n, c, y + dy, x + dx] * weights[k, c, dy, dx], axis=[dy, dx, c]), name=BLOCKS_SUM)
    c = te.reduce_axis((0, block), name="rc")

    def block_sum(n, b, k, y, x):
        channel = b * block + c
        if channels % block == 0:
            return multiply_added(image[n, channel, y + dy, x + dx] * weights[k, channel, dy, dx], axis=[dy, dx, c])
        # The last block is ragged. TVM 0.27's create_prim_func drops a reduction's `where`, so the
        # missing channels read the last one (in bounds) and add +0 x -0 = -0, which leaves every
        # sum as it is (x + -0 = x, for x = +0 and -0 too); the product stays fused into the add.
        within = channel < channels
        last = tvm.tirx.min(channel, channels - 1)
        zero = tvm.tirx.const(0.0, image.dtype)
        pixel = tvm.tirx.Select(within, image[n, last, y + dy, x + dx], zero)
        weight = tvm.tirx.Select(within, weights[k, last, dy, dx], tvm.tirx.const(-0.0, image.dtype))
        return multiply_added(pixel * weight, axis=[dy, dx, c])

    sums = te.compute((batch, blocks, *out_shape[1:]), block_sum, name=BLOCK_SUMS)
    b = te.reduce_axis((0, blocks), name="rb")
    return te.compute(out_shape, lambda n, k, y, x: _rounded_sum(sums[n, b, k, y, x], axis=b), name=BLOCKS_SUM)


MLAS_STRIDE_N = 128  # MLAS SGEMM's column stride, from which it trades columns for k's


def mlas_k_stride(columns: int | None, k: int, stride_k: int) -> int:
    """The K stride MLAS's SGEMM takes for a product by an unpacked weight of `columns` columns
    (an image's output pixels) and `k` rows: where the columns are fewer than the k's it halves
    its column stride down to 16 while half of it still holds every column, doubling its K
    stride each time. Unknown columns (a symbolic image): the base stride."""
    stride_n = MLAS_STRIDE_N
    if columns is not None and columns < k:
        while stride_n > 16 and stride_n // 2 >= columns:
            stride_n //= 2
            stride_k *= 2
    return stride_k


def _im2col_k_block(weights: te.Tensor, out_shape, k_stride: int) -> int:
    """The products per K block MLAS takes for this conv's im2col product (mlas_k_stride)."""
    _, channels, rows, cols = (int(d) for d in weights.shape)
    height, width = (tir_walk.static_int(d) for d in out_shape[2:])
    pixels = height * width if height is not None and width is not None else None
    return mlas_k_stride(pixels, channels * rows * cols, k_stride)


def _im2col_position(flat, weights: te.Tensor):
    """(c, dy, dx) of the flat-th product in im2col order (the window column innermost)."""
    rows, cols = (int(d) for d in weights.shape[2:])
    return flat // (rows * cols), flat % (rows * cols) // cols, flat % cols


def conv2d_in_k_blocks(image: te.Tensor, weights: te.Tensor, out_shape, k_stride: int) -> te.Tensor:
    """aarch64's order (module doc): the products in im2col order (c, dy, dx), in blocks of
    MLAS's K stride, each block's sum from 0, the blocks added in order."""
    _, channels, rows, cols = (int(d) for d in weights.shape)
    total = channels * rows * cols
    k_block = _im2col_k_block(weights, out_shape, k_stride)
    if total <= k_block:
        c, dy, dx = te.reduce_axis((0, channels), name="rc"), te.reduce_axis((0, rows), name="ry"), \
            te.reduce_axis((0, cols), name="rx")
        return te.compute(out_shape, lambda n, k, y, x: multiply_added(
            image[n, c, y + dy, x + dx] * weights[k, c, dy, dx], axis=[c, dy, dx]), name=BLOCKS_SUM)
    blocks = -(-total // k_block)
    t = te.reduce_axis((0, k_block), name="rt")

    def block_sum(n, b, k, y, x):
        flat = b * k_block + t
        # A ragged last block reads the last product and adds +0 x -0 = -0 (conv2d_in_blocks).
        within = flat < total
        c, dy, dx = _im2col_position(tvm.tirx.min(flat, total - 1), weights)
        pixel = tvm.tirx.Select(within, image[n, c, y + dy, x + dx], tvm.tirx.const(0.0, image.dtype))
        weight = tvm.tirx.Select(within, weights[k, c, dy, dx], tvm.tirx.const(-0.0, image.dtype))
        return multiply_added(pixel * weight, axis=[t])

    sums = te.compute((out_shape[0], blocks, *out_shape[1:]), block_sum, name=BLOCK_SUMS)
    b = te.reduce_axis((0, blocks), name="rb")
    return te.compute(out_shape, lambda n, k, y, x: _rounded_sum(sums[n, b, k, y, x], axis=b), name=BLOCKS_SUM)


def conv2d_with_sum(data: te.Tensor, weights: te.Tensor, bias: te.Tensor, addend: te.Tensor, padding) -> te.Tensor:
    """aarch64: `conv + bias + addend` as onnxruntime's Conv fused with a sum input computes it
    (its optimizer fuses a Conv with a bias into the residual Add that alone reads it): MLAS's
    product starts from the addend, so each K block's sum is added to it in turn, and the bias
    last: ((addend + s0) + s1 ...) + bias. The whole blocks are one stage and a ragged last block
    one of its own, so no product is masked: with conv2d_in_k_blocks' masked last block, LLVM
    left one unrolled row's product unfused here (2% of the values 1 ulp off)."""
    image, out_shape = _padded(data, weights, padding)
    total = int(weights.shape[1]) * int(weights.shape[2]) * int(weights.shape[3])
    k_block = _im2col_k_block(weights, out_shape, sum_orders.current().conv_k_block)
    whole, ragged = divmod(total, k_block)

    def products(first: int, count: int, name: str):
        t = te.reduce_axis((0, count), name="rt")

        def chain(n, b, k, y, x):
            c, dy, dx = _im2col_position(first + b * k_block + t, weights)
            return multiply_added(image[n, c, y + dy, x + dx] * weights[k, c, dy, dx], axis=[t])

        if name == BLOCK_SUMS:
            return te.compute((out_shape[0], whole, *out_shape[1:]), chain, name=name)
        return te.compute(out_shape, lambda n, k, y, x: chain(n, 0, k, y, x), name=name)

    sums = products(0, k_block, BLOCK_SUMS) if whole else None
    last = products(whole * k_block, ragged, BLOCK_SUMS + "_ragged") if ragged else None

    def element(n, k, y, x):
        value = addend[n, k, y, x]
        for b in range(whole):
            value = value + rounded(sums(n, b, k, y, x))
        if last is not None:
            value = value + rounded(last(n, k, y, x))
        index = (n, k, y, x)[4 - len(bias.shape):]  # the bias broadcast: [K, 1, 1] or [1, K, 1, 1]
        return value + bias[tuple(0 if tir_walk.static_int(d) == 1 else i for d, i in zip(bias.shape, index))]

    return te.compute(out_shape, element, name=CONV_WITH_SUM)


def legalize_conv2d(bb, call):
    """The blocked lowering where is_blocked_conv holds, else TVM's own (topi.nn.conv)."""
    attrs = call.attrs
    if attrs.out_layout != attrs.data_layout or len(attrs.data_layout) != 4 or len(attrs.kernel_layout) != 4:
        return call  # as TVM's own legalization: topi cannot lower these either

    def lowered(data, weights):
        if is_blocked_conv(data, weights, attrs):
            return conv2d_in_blocks(data, weights, list(attrs.padding))
        ints = lambda values: [int(v) for v in values]  # noqa: E731 - TVM arrays as topi's lists
        return topi.nn.conv(data, weights, ints(attrs.strides), ints(attrs.padding), ints(attrs.dilation),
                            int(attrs.groups), str(attrs.data_layout), str(attrs.kernel_layout),
                            _out_dtype(attrs) or data.dtype)

    return bb.call_te(lowered, call.args[0], call.args[1], primfunc_name_hint="conv2d")

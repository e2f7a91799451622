"""The keras part of the corpus: small Keras 3 models (TensorFlow backend) converted by tf2onnx.

tf2onnx writes what the TensorFlow graph computes, which is not what PyTorch's exporters write:
NHWC convolutions between Transposes, a dense bias as its own Add, LSTM layers as one-op LSTM
with the batch and time axes swapped around it, a GRU whose reset gate acts after the product
(Keras' default) as a Loop over time, LayerNormalization as its moments, and a batch dimension
named `unk__<n>`. Weights are drawn at random (a freshly built Keras model has zero biases,
which tf2onnx folds away); the inputs are standard-normal floats.

A rerun gives the same graphs, weights, inputs and expected outputs, but not the same bytes:
tf2onnx numbers the names it generates (`unk__<n>` dims, `__<n>` node suffixes) with a counter
that ended one or two apart between runs, even with PYTHONHASHSEED fixed.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
from corpus_common import HERE, SEED, export_recorded, save_model  # noqa: E402

OPSET = 17


def _versions() -> dict:
    import keras
    import onnx
    import onnxruntime
    import tensorflow as tf
    import tf2onnx

    return {"tensorflow": tf.__version__, "keras": keras.__version__, "tf2onnx": tf2onnx.__version__,
            "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__, "numpy": np.__version__}


def _randomize(model, rng) -> None:
    """Every weight drawn at random: kernels scaled by 1/sqrt(fan-in), biases and BatchNorm's
    statistics away from their neutral start (variances and scales in [0.5, 1.5])."""
    for weight in model.weights:
        shape = tuple(weight.shape)
        if any(part in weight.path for part in ("moving_variance", "gamma")):
            value = rng.uniform(0.5, 1.5, shape)
        else:
            fan_in = int(np.prod(shape[:-1])) if len(shape) > 1 else 4
            value = rng.standard_normal(shape) / np.sqrt(fan_in)
        weight.assign(value.astype(np.float32))


def _sequential(input_shape, *layers):
    import keras

    inputs = keras.Input(input_shape, name="x")
    value = inputs
    for layer in layers:
        value = layer(value)
    return keras.Model(inputs, value)


def _mlp():
    import keras
    from keras import layers

    return _sequential((20,), layers.Dense(64, activation="relu"), layers.Dropout(0.2), layers.Dense(32),
                       layers.Activation(lambda t: keras.activations.gelu(t, approximate=True)),
                       layers.Dense(10, activation="softmax"))


def _cnn():
    from keras import layers

    return _sequential((28, 28, 1), layers.Conv2D(8, 3, activation="relu"), layers.BatchNormalization(),
                       layers.MaxPooling2D(), layers.Conv2D(16, 3, padding="same", activation="swish"),
                       layers.GlobalAveragePooling2D(), layers.Dense(10, activation="softmax"))


def _lstm():
    from keras import layers

    return _sequential((None, 16), layers.LSTM(32), layers.Dense(4))


def _bilstm():
    from keras import layers

    return _sequential((10, 16), layers.Bidirectional(layers.LSTM(24, return_sequences=True)),
                       layers.LSTM(16), layers.Dense(4))


def _gru():
    from keras import layers

    return _sequential((None, 16), layers.GRU(32), layers.Dense(4))


def _encoder():
    import keras
    from keras import layers

    inputs = keras.Input((16, 32), name="x")
    attended = layers.MultiHeadAttention(num_heads=4, key_dim=8)(inputs, inputs)
    hidden = layers.LayerNormalization()(inputs + attended)
    expanded = layers.Activation(lambda t: keras.activations.gelu(t, approximate=True))(layers.Dense(64)(hidden))
    return keras.Model(inputs, layers.LayerNormalization()(hidden + layers.Dense(32)(expanded)))


# name → (builder, input shape with None for symbolic dims, rows fed, what it computes)
SPECS = {
    "keras_mlp": (_mlp, (None, 20), 8, "Keras MLP on [B, 20]: Dense-ReLU, Dropout, Dense + GELU (tanh approximation), "
                  "Dense-softmax to 10"),
    "keras_cnn": (_cnn, (None, 28, 28, 1), 4, "Keras CNN on NHWC [B, 28, 28, 1]: Conv2D(8, 3)-ReLU, BatchNormalization, "
                  "MaxPooling2D, Conv2D(16, 3, same)-swish, GlobalAveragePooling2D, Dense-softmax to 10"),
    "keras_lstm": (_lstm, (None, None, 16), 4, "Keras LSTM(32) over [B, T, 16] (T symbolic), last state, Dense to 4"),
    "keras_bilstm": (_bilstm, (None, 10, 16), 4, "Keras Bidirectional(LSTM(24), whole sequence) then LSTM(16) over "
                     "[B, 10, 16], Dense to 4"),
    "keras_gru": (_gru, (None, None, 16), 4, "Keras GRU(32) (reset gate after the product) over [B, T, 16], Dense to 4"),
    "keras_encoder": (_encoder, (None, 16, 32), 4, "Keras transformer encoder block on [B, 16, 32]: MultiHeadAttention "
                      "(4 heads of 8), residual + LayerNormalization, Dense(64) + GELU (tanh approximation), "
                      "Dense(32), residual + LayerNormalization"),
}


def _one(name: str, spec, entries: dict) -> None:
    import keras
    import tensorflow as tf
    import tf2onnx

    build, shape, rows, computes = spec
    keras.backend.clear_session()  # layer names count from 0 again, whichever models came before
    keras.utils.set_random_seed(SEED)
    rng = np.random.default_rng(SEED)
    path = os.path.join(HERE, f"{name}.onnx")
    entry = {"exporter": "tf2onnx.convert.from_keras", "versions": _versions(), "computes": computes,
             "source": "models/exported/corpus_keras.py",
             "options": {"opset": OPSET, "input_signature": [list(shape)]}}
    if os.path.exists(path):
        os.remove(path)

    def export() -> dict:
        model = build()
        _randomize(model, rng)
        fed = [rows if d is None and i == 0 else (7 if d is None else d) for i, d in enumerate(shape)]
        x = rng.standard_normal(fed).astype(np.float32)
        reference = [np.asarray(model(x, training=False))]
        signature = (tf.TensorSpec(shape, tf.float32, name="x"),)
        tf2onnx.utils.INTERNAL_NAME = 1  # its generated names (`unk__<n>` dims) count per process
        tf2onnx.convert.from_keras(model, input_signature=signature, opset=OPSET, output_path=path)
        return save_model(name, path, {"x": x}, entry, reference=reference)

    export_recorded(entries, name, path, entry, export)


def build(only=None) -> dict:
    entries: dict = {}
    for name, spec in SPECS.items():
        if not only or name in only:
            _one(name, spec, entries)
    return entries

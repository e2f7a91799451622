"""Tree ensembles of the corpus: Hummingbird's three tree strategies for four model families,
and skl2onnx for a scikit-learn MLP pipeline and for the random forest (ONNX-ML reference).

All models are trained on the same synthetic HIGGS-like data (28 float features, 2 classes)
from fixed seeds; the recorded input batch is 64 rows of that training data.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import warnings

import numpy as np
from corpus_common import HERE, SEED, failed_entry, higgs_like, save_model

STRATEGIES = ("tree_trav", "perf_tree_trav", "gemm")
N_ROWS = 64


def _version(mod):
    import importlib.metadata

    try:
        return importlib.metadata.version(mod)
    except importlib.metadata.PackageNotFoundError:
        return None


def _versions(*extra):
    out = {}
    for mod in ("onnx", "onnxruntime", "scikit-learn", "numpy") + extra:
        out[mod] = _version(mod)
    out["onnxruntime_used_for_expected"] = out.pop("onnxruntime")
    return out


def _models():
    """name stem -> (factory, description, versions of the training library)."""
    from sklearn.ensemble import GradientBoostingClassifier, RandomForestClassifier

    out = {
        "rf": (lambda: RandomForestClassifier(n_estimators=100, max_depth=8, random_state=SEED,
                                              n_jobs=1),
               "scikit-learn RandomForestClassifier(n_estimators=100, max_depth=8)", ()),
        "gbdt": (lambda: GradientBoostingClassifier(n_estimators=50, max_depth=4,
                                                    random_state=SEED),
                 "scikit-learn GradientBoostingClassifier(n_estimators=50, max_depth=4), binary",
                 ()),
    }
    try:
        import lightgbm

        # max_depth=8: LightGBM's leaf-wise trees are otherwise unbounded in depth, and
        # perf_tree_trav's tables grow as 2**depth (the unbounded forest gave a 105 MB file).
        out["lgbm"] = (lambda: lightgbm.LGBMClassifier(n_estimators=50, num_leaves=31,
                                                       max_depth=8, random_state=SEED, n_jobs=1,
                                                       verbose=-1, deterministic=True),
                       "LightGBM LGBMClassifier(n_estimators=50, num_leaves=31, max_depth=8)",
                       ("lightgbm",))
    except ImportError:
        pass
    try:
        import xgboost

        out["xgb"] = (lambda: xgboost.XGBClassifier(n_estimators=50, max_depth=6,
                                                    random_state=SEED, n_jobs=1,
                                                    tree_method="exact"),
                      "XGBoost XGBClassifier(n_estimators=50, max_depth=6, tree_method='exact')",
                      ("xgboost",))
    except ImportError:
        pass
    return out


GEMM_RF_TREES = 20


def _first_trees(forest, n):
    """A copy of a fitted scikit-learn forest keeping its first n trees."""
    import copy

    out = copy.copy(forest)
    out.estimators_ = forest.estimators_[:n]
    out.n_estimators = n
    return out


@contextlib.contextmanager
def _legacy_torch_export():
    """Hummingbird 0.4.12 calls torch.onnx.export without `dynamo`; torch 2.13 defaults to the
    dynamo exporter, which Hummingbird's traced executor does not go through. Force the
    TorchScript exporter, as Hummingbird was written for."""
    import torch

    original = torch.onnx.export

    def export(*args, **kwargs):
        kwargs.setdefault("dynamo", False)
        return original(*args, **kwargs)

    torch.onnx.export = export
    try:
        yield
    finally:
        torch.onnx.export = original


@contextlib.contextmanager
def _in_tmpdir():
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory() as tmp:
        os.chdir(tmp)
        try:
            yield tmp
        finally:
            os.chdir(cwd)


def _shallow_defaults():
    """name -> (factory, description): shallow ensembles through Hummingbird with its defaults,
    which picks its GEMM strategy for trees of depth 3 or less. scikit-learn's gradient boosting
    with its own defaults (100 trees of depth 3) is the form most users of the two get."""
    from sklearn.ensemble import GradientBoostingClassifier, GradientBoostingRegressor, RandomForestClassifier

    return {
        "hb_gbdt_defaults": (lambda: GradientBoostingClassifier(random_state=SEED),
                             "scikit-learn GradientBoostingClassifier() with its defaults (100 trees, max_depth=3), "
                             "binary"),
        "hb_gbr_defaults": (lambda: GradientBoostingRegressor(random_state=SEED),
                            "scikit-learn GradientBoostingRegressor() with its defaults (100 trees, max_depth=3), "
                            "fitted to the 0/1 labels"),
        "hb_rf_d3": (lambda: RandomForestClassifier(n_estimators=50, max_depth=3, random_state=SEED, n_jobs=1),
                     "scikit-learn RandomForestClassifier(n_estimators=50, max_depth=3), binary"),
    }


def _hummingbird(stem, model, description, lib_versions, X, rows, entries, only, strategies=STRATEGIES,
                 name_of=None):
    """Hummingbird's export of `model` with each of `strategies` (None: Hummingbird's own choice)."""
    import hummingbird.ml
    import onnx
    import torch

    for strategy in strategies:
        name = name_of(strategy) if name_of else f"hb_{stem}_{strategy}"
        if only and name not in only:
            continue
        path = os.path.join(HERE, f"{name}.onnx")
        extra_config = {"tree_implementation": strategy} if strategy else {}
        entry = {
            "exporter": "hummingbird.ml.convert(model, 'onnx', X_sample, extra_config)",
            "versions": dict(_versions(*lib_versions), **{
                "hummingbird-ml": _version("hummingbird-ml"), "torch": torch.__version__}),
            "options": {"extra_config": extra_config,
                        "X_sample": f"first {N_ROWS} training rows",
                        "torch.onnx.export": "dynamo=False forced around hummingbird "
                                             "(torch 2.13 defaults to dynamo=True); opset is "
                                             "Hummingbird's default"},
            "computes": f"{description} on 28 features; outputs "
                        + ("label and class probabilities" if hasattr(model, "predict_proba") else "the prediction"),
            "source": "models/exported/corpus_trees.py",
        }
        if os.path.exists(path):
            os.remove(path)
        try:
            if stem == "rf" and strategy == "gemm":
                model = _first_trees(model, GEMM_RF_TREES)
                entry["options"]["trees"] = (
                    f"the first {GEMM_RF_TREES} of the 100 trees: with all 100 the gemm file is "
                    "10.7 MB (per tree dense [28 x internal] and [internal x leaves] matrices)")
                entry["computes"] = entry["computes"].replace("n_estimators=100",
                                                              f"first {GEMM_RF_TREES} of 100 trees")
            torch.manual_seed(SEED)
            with warnings.catch_warnings(), _legacy_torch_export(), _in_tmpdir():
                warnings.simplefilter("ignore")
                container = hummingbird.ml.convert(model, "onnx", rows, extra_config=dict(extra_config))
            onnx.save(container.model, path)
            input_name = container.model.graph.input[0].name
            ref = ([model.predict(rows).astype(np.int64), model.predict_proba(rows).astype(np.float32)]
                   if hasattr(model, "predict_proba") else [model.predict(rows).astype(np.float32).reshape(-1, 1)])
            entries[name] = save_model(name, path, {input_name: rows}, entry, reference=ref,
                                       rtol=1e-4, atol=1e-5, strict=False)
        except Exception as exc:
            if os.path.exists(path):
                os.remove(path)
            entries[name] = failed_entry(entry, exc)
        print(f"{name}: {entries[name]['status']} "
              f"{entries[name].get('node_count', entries[name].get('error', ''))}", flush=True)


def _skl2onnx(name, model, description, X, rows, entries, only, options=None):
    if only and name not in only:
        return
    path = os.path.join(HERE, f"{name}.onnx")
    entry = {"exporter": "skl2onnx.to_onnx(model, X_sample)",
             "versions": dict(_versions(), **{"skl2onnx": _version("skl2onnx")}),
             "options": {"X_sample": f"first {N_ROWS} training rows", "options": options or {},
                         "target_opset": "skl2onnx's default"},
             "computes": description, "source": "models/exported/corpus_trees.py"}
    try:
        from skl2onnx import to_onnx

        onx = to_onnx(model, rows, options=options)
        with open(path, "wb") as f:
            f.write(onx.SerializeToString())
        ref = [model.predict(rows).astype(np.int64), model.predict_proba(rows).astype(np.float32)]
        entries[name] = save_model(name, path, {onx.graph.input[0].name: rows}, entry,
                                   reference=ref, rtol=1e-4, atol=1e-5)
    except Exception as exc:
        if os.path.exists(path):
            os.remove(path)
        entries[name] = failed_entry(entry, exc)
    print(f"{name}: {entries[name]['status']} "
          f"{entries[name].get('node_count', entries[name].get('error', ''))}", flush=True)


def build(only=None) -> dict:
    import torch

    torch.set_num_threads(1)
    X, y = higgs_like()
    rows = np.ascontiguousarray(X[:N_ROWS])
    entries: dict = {}
    fitted = {}
    for stem, (make, description, lib_versions) in _models().items():
        wanted = [f"hb_{stem}_{s}" for s in STRATEGIES] + (["skl2onnx_rf"] if stem == "rf" else [])
        if only and not set(wanted) & set(only):
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = make().fit(X, y)
        fitted[stem] = model
        _hummingbird(stem, model, description, lib_versions, X, rows, entries, only)
    for name, (make, description) in _shallow_defaults().items():
        if only and name not in only:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = make().fit(X, y)
        _hummingbird(name, model, f"{description}; Hummingbird's default strategy (GEMM for trees this shallow)",
                     (), X, rows, entries, only, strategies=(None,), name_of=lambda _, name=name: name)
    if "rf" in fitted:
        _skl2onnx("skl2onnx_rf", fitted["rf"],
                  "the same RandomForestClassifier(100 trees, depth 8) as hb_rf_*, as one "
                  "ONNX-ML TreeEnsembleClassifier (zipmap off): label and probabilities", X, rows,
                  entries, only, options={"zipmap": False})
    if not only or "skl2onnx_mlp" in only:
        from sklearn.neural_network import MLPClassifier
        from sklearn.pipeline import Pipeline
        from sklearn.preprocessing import StandardScaler

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pipe = Pipeline([("scale", StandardScaler()),
                             ("mlp", MLPClassifier(hidden_layer_sizes=(64, 32), max_iter=200,
                                                   random_state=SEED))]).fit(X, y)
        _skl2onnx("skl2onnx_mlp", pipe,
                  "scikit-learn Pipeline(StandardScaler, MLPClassifier(hidden_layer_sizes=(64, "
                  "32), relu)) on 28 features (zipmap off): label and probabilities", X, rows,
                  entries, only, options={"zipmap": False})
    return entries

"""Builds the corpus of real exporter outputs in models/exported/.

Three parts, each run in its own virtualenv because the exporters' pins conflict (see README.md):

    ~/.cache/onnxfuse-corpus/torch-venv/bin/python models/exported/make_corpus.py torch  # torch.onnx
    ~/.cache/onnxfuse-corpus/hb-venv/bin/python models/exported/make_corpus.py trees     # hummingbird
    ~/.cache/onnxfuse-corpus/tf-venv/bin/python models/exported/make_corpus.py keras     # tf2onnx

Each part writes <name>.onnx, <name>.inputs.npz (one realistic input batch keyed by the
model's input names) and <name>.expected.npz (onnxruntime's outputs on it), and replaces its
own entries in manifest.json. `--only NAME[,NAME]` rebuilds single models. Seeds are fixed.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("PYTHONHASHSEED", "0")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=["torch", "trees", "keras"])
    parser.add_argument("--only", default="", help="comma-separated model names to rebuild")
    args = parser.parse_args(argv)
    only = set(filter(None, args.only.split(",")))

    from corpus_common import merge_manifest

    if args.part == "torch":
        import corpus_torch

        entries = corpus_torch.build(only)
    elif args.part == "keras":
        import corpus_keras

        entries = corpus_keras.build(only)
    else:
        import corpus_trees

        entries = corpus_trees.build(only)
    if only:  # keep the part's other entries
        import json

        from corpus_common import MANIFEST

        if os.path.exists(MANIFEST):
            with open(MANIFEST) as f:
                old = json.load(f)["models"]
            for k, v in old.items():
                if v.get("part") == args.part and k not in entries:
                    entries[k] = v
    merge_manifest(entries, args.part)
    failed = sorted(k for k, v in entries.items() if v["status"] != "ok")
    print(f"{args.part}: {len(entries) - len(failed)} exported, {len(failed)} failed "
          f"{failed if failed else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

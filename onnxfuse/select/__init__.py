"""Which compiled groups the output uses (`--select`).

auto      deterministic: every group but those whose ops onnxruntime runs much faster (auto.py)
all       every group that compiles and verifies
measured  each kernel timed against onnxruntime on its own nodes (measured.py), then the whole
          model against the original (whole_model.py)

Selection decides; the pipeline applies the decisions to its outcomes. Whatever the selection,
the written model with its library is then checked against the original (shipped.py), which
falls back the groups that make it differ.
"""

SELECTIONS = ("auto", "all", "measured")

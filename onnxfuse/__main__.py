"""`python -m onnxfuse ...` is the `onnxfuse` command."""

from onnxfuse_cli.main import main

if __name__ == "__main__":
    main(prog_name="onnxfuse")

"""The errors onnxfuse raises on purpose: each one is a clear, one-line message for the user."""

import re


class OnnxfuseError(Exception):
    """Base class: the CLI prints the message and exits with `exit_code`, no traceback."""

    exit_code = 1


class ModelLoadError(OnnxfuseError):
    """The input is not a readable ONNX model (corrupt, truncated, missing, not ONNX)."""

    exit_code = 2


class UsageError(OnnxfuseError):
    """An option or environment the user must fix (e.g. a missing cross toolchain)."""

    exit_code = 2


class CompileError(OnnxfuseError):
    """One group could not be lowered or compiled; the group falls back to onnxruntime."""


def first_line(exc: BaseException, limit: int = 200) -> str:
    """An exception's first line, for one-line messages. onnxruntime prefixes the reason with
    its source location and a C++ signature (`/onnxruntime_src/...cc:256 Model::Model(...)`),
    long enough to push the reason past any sensible limit; those go."""
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return without_source_location(text)[:limit]


def short_reason(exc: BaseException, limit: int = 200) -> str:
    """The line of an exception that says what went wrong, for one-line messages about TVM and
    onnxruntime failures: TVM puts its message after a long traceback, so the last line that
    names an exception type (`InternalError: ...`) wins, else the last line."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    named = [ln for ln in lines if re.search(r"\w*(Error|Exception):", ln)]
    text = named[-1] if named else (lines[-1] if lines else type(exc).__name__)
    return without_source_location(text)[:limit]


def without_source_location(text: str) -> str:
    """`text` without onnxruntime's `/onnxruntime_src/file.cc:N Signature(...)` prefix."""
    start = text.find("/onnxruntime_src/")
    if start < 0:
        return text
    signature = text.find(" ", start) + 1
    if signature == 0:
        return text[:start]
    paren = text.find("(", signature)
    if paren < 0 or " " in text[signature:paren]:  # no C++ signature: drop the location only
        return (text[:start].rstrip() + " " + text[signature:]).strip()
    depth, end = 0, signature
    while end < len(text):  # the signature runs to its balanced closing parenthesis
        depth += {"(": 1, ")": -1}.get(text[end], 0)
        end += 1
        if depth == 0 and text[end - 1] == ")":
            break
    return (text[:start].rstrip() + " " + text[end:].strip()).strip()

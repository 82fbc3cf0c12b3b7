#!/usr/bin/env bash
# Build the Hermes VM (the `hermes` CLI) that matches the hermesc React Native ships, for the Hermes tier
# (pytest --android-core --hermes-vm PATH). No package registry ships a recent Hermes VM for Linux x64
# (android_demo/README.md); this builds one from the Hermes sources at the tag in
# app/node_modules/react-native/sdks/.hermesversion (run `npm ci` in app/ first).
#
#   android_demo/scripts/build_hermes_vm.sh HERMES_SRC [BUILD_DIR]    # prints the VM's path
#
# HERMES_SRC: a checkout of the Hermes repository (facebook/hermes) at that tag, e.g.
#   git clone --depth 1 --branch "$(cat android_demo/app/node_modules/react-native/sdks/.hermesversion)" \
#     https://github.com/facebook/hermes HERMES_SRC
# Needs cmake, ninja, a C++17 compiler and ICU (Debian: apt-get install cmake ninja-build g++ libicu-dev).
# About 15 minutes on 2 cores (measured 2026-12-01 under load, at nice 19).
set -euo pipefail
src=$(realpath "${1:?usage: build_hermes_vm.sh HERMES_SRC [BUILD_DIR]}")
build=$(realpath -m "${2:-$src/build-vm}")
here=$(dirname "$(realpath "$0")")
want=$(cat "$here/../app/node_modules/react-native/sdks/.hermesversion" 2>/dev/null || true)
[ -n "$want" ] || { echo "build_hermes_vm.sh: run npm ci in android_demo/app first (no .hermesversion)" >&2; exit 1; }
have=$(git -C "$src" describe --tags --exact-match 2>/dev/null || echo "?")
[ "$have" = "$want" ] || echo "build_hermes_vm.sh: note: $src is at $have, React Native's hermesc is $want" >&2
cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DHERMES_ENABLE_TEST_SUITE=OFF >/dev/null
ninja -C "$build" bin/hermes >&2
"$build/bin/hermes" -version | grep -q "HBC bytecode version: $("$here/../app/node_modules/react-native/sdks/hermesc/linux64-bin/hermesc" -version | sed -n 's/.*HBC bytecode version: //p')" \
  || { echo "build_hermes_vm.sh: the VM's bytecode version differs from React Native's hermesc" >&2; exit 1; }
echo "$build/bin/hermes"

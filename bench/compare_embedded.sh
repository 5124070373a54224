#!/usr/bin/env bash
# The committed `specmac compare` run on the embedded tiny pair: all 9 draft:target pairings of
# mlx, gguf and torch, plus ngram:gguf, K = 1..8, default backend options, CPU only.
# Writes results/embedded/{results.json,summary.md,*.png}; extra arguments go to specmac compare
# (e.g. --repeats 3). A few minutes on 2 CPU cores.
set -euo pipefail
cd "$(dirname "$0")/.."

pairs=()
for target in mlx gguf torch; do
    for draft in mlx gguf torch; do
        pairs+=(--pair "$draft:$target")
    done
done
pairs+=(--pair ngram:gguf)

exec python -m specmac compare "${pairs[@]}" --k 1-8 --n-prompts 4 --repeats 2 --max-tokens 32 \
    --temperature 0 --out results/embedded "$@"

#!/usr/bin/env bash
# The voice benchmark of docs/benchmarks.md: spoken one-sentence questions (made with Piper), then
# `edgespec voice --bench --live` on the default pair, speculation on and off in one run, each question answered
# from the WAV file and replayed in real time through the endpointer (eager turns and not).
# Needs the voice extra and the default pair exported. Writes bench/results/voice.json.
set -euo pipefail
cd "$(dirname "$0")/.."
q="${TMPDIR:-/tmp}/edgespec-voice-questions"
mkdir -p "$q"
i=0
while IFS= read -r line; do
  i=$((i + 1))
  [ -f "$q/q$(printf %02d $i).wav" ] || edgespec voice --say "$line" --wav-out "$q/q$(printf %02d $i).wav"
done <<'QUESTIONS'
What is the capital of France?
How do I reverse a list in Python?
What does a hash map do?
Why is the sky blue?
How many minutes are in a day?
What is a prime number?
Name a good way to learn to program.
What does the acronym CPU stand for?
QUESTIONS
edgespec voice --bench "$q" --live --out bench/results/voice.json "$@"

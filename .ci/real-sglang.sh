#!/usr/bin/env bash
# CI stage (called by .ci/run after the README's test command): real SGLang on CPU.
#  1. the release's environment (python -m gpu.sglang_cpu install; a no-op when it is up to date);
#  2. the conformance cases on real SGLang, on one pair of engines shared by the session and reset between scenarios
#     (-m sglang conformance/suite), and on the same engines this commit's share of the mutants
#     (tests/gpu/test_mutants_real.py with WEIGHTSYNC_MUTANT_SHARE=i/7, i the commit count mod 7: every mutant runs
#     on real SGLang within 7 consecutive commits; all of them take ~25 min on 2 cores, past CI's budget);
#  3. the one-engine checks: the reset and teardown of shared engines (tests/gpu/test_engine_pool.py) and the
#     differential fidelity check, fake against real SGLang (tests/gpu/test_fidelity.py);
#  4. the differential on every other release real SGLang runs on CPU (fakes.facts.SGLANG.cpu_releases), each in
#     its own environment.
# At most two real engines run at once (2 in step 2, 1 in steps 3 and 4). pytest exit 5 (nothing collected) fails, and
# so does a step where every test skipped (.ci/ran_something.py).
set -euo pipefail
cd "$(dirname "$0")/.."
release=${WEIGHTSYNC_CI_SGLANG_RELEASE:-0.5.23}
started=$SECONDS

python -m gpu.sglang_cpu install --release "$release"
echo "CI: real SGLang $release environment ready in $((SECONDS - started)) s"

junit=$(mktemp -d)
run() {  # run RELEASE PYTEST-ARGS...
  local release=$1 t0=$SECONDS code xml="$junit/stage-$SECONDS-$RANDOM.xml"
  shift
  set +e
  pytest -m sglang -p no:cacheprovider --timeout 900 --conformance-sglang-release "$release" --junitxml "$xml" "$@"
  code=$?
  set -e
  echo "CI: pytest -m sglang ($release) $* -> exit $code in $((SECONDS - t0)) s"
  if [ "$code" -eq 5 ]; then
    echo "CI: pytest collected no tests (exit 5) — failing" >&2
    code=1
  elif [ "$code" -eq 0 ] && ! python .ci/ran_something.py "$xml"; then
    code=1  # every test skipped: the real engine never judged anything
  fi
  return "$code"
}

cases=0; checks=0; others=0
WEIGHTSYNC_MUTANT_SHARE="$(( $(git rev-list --count HEAD 2>/dev/null || echo 0) % 7 ))/7"
export WEIGHTSYNC_MUTANT_SHARE
echo "CI: the mutants on real SGLang: share $WEIGHTSYNC_MUTANT_SHARE"
run "$release" conformance/suite tests/gpu/test_mutants_real.py || cases=$?
unset WEIGHTSYNC_MUTANT_SHARE
run "$release" tests/gpu/test_engine_pool.py tests/gpu/test_fidelity.py || checks=$?
for other in $(python -c "from fakes.facts import SGLANG; print(*SGLANG.cpu_releases)"); do
  [ "$other" = "$release" ] && continue
  t0=$SECONDS
  python -m gpu.sglang_cpu install --release "$other" || { others=1; continue; }
  echo "CI: real SGLang $other environment ready in $((SECONDS - t0)) s"
  run "$other" tests/gpu/test_fidelity.py || others=$?
done
echo "CI: real SGLang stage (install + tests) took $((SECONDS - started)) s"
[ "$cases" -ne 0 ] && exit "$cases"
[ "$checks" -ne 0 ] && exit "$checks"
exit "$others"

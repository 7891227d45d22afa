# Sourced by the real-engine CI stages (.ci/real-sglang.sh, .ci/real-vllm.sh): one pytest run of a stage.
# run_stage LABEL PYTEST-ARGS... runs pytest with a JUnit report, prints "CI: LABEL: pytest ARGS -> exit N in S s", and fails
# (exit status 1) when pytest collected nothing (exit 5) or every test it collected skipped (.ci/ran_something.py):
# a real engine that never came up must not pass unseen.
junit=$(mktemp -d)
run_stage() {
  local label=$1 t0=$SECONDS code xml="$junit/stage-$SECONDS-$RANDOM.xml"
  shift
  set +e
  pytest -p no:cacheprovider --timeout 900 --junitxml "$xml" "$@"
  code=$?
  set -e
  echo "CI: $label: pytest $* -> exit $code in $((SECONDS - t0)) s"
  if [ "$code" -eq 5 ]; then
    echo "CI: pytest collected no tests (exit 5) — failing" >&2
    code=1
  elif [ "$code" -eq 0 ] && ! python .ci/ran_something.py "$xml"; then
    code=1  # every test skipped: the real engine never judged anything
  fi
  return "$code"
}

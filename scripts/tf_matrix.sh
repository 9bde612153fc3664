#!/usr/bin/env bash
# Builds tfbigconv against each TensorFlow from 2.16 to 2.21 (the latest patch
# of each, CPU wheels from PyPI), each in its own venv, and runs a quick subset
# of the tests there: the compiled ops in 1-D, 2-D and 3-D, their gradients,
# graph mode and TF1, the Keras layers, the op library's loading. One result
# line per version goes to stdout and to $TF_MATRIX_DIR/results.md.
#
#   scripts/tf_matrix.sh                    all versions below
#   scripts/tf_matrix.sh 2.16.2 2.21.0      these
#   TF_ENABLE_ONEDNN_OPTS=0 scripts/tf_matrix.sh 2.16.2    with TF's own kernels
#
# Each version works in $TF_MATRIX_DIR/tf-<version>/ (default /tmp/tf_matrix):
# venv/ (kept while its requirements are unchanged), src/ (a copy of this
# checkout's files, tracked and untracked but not ignored, so the checkout's own
# build is untouched; rebuilt when they change), deps.log, build.log, tests.log.
# Each test file runs in its own pytest process: a test that crashes the
# interpreter (or outlasts the timeout) is counted as failed, named in the
# line, and the file runs again without it. Environment: PYTHON (a Python 3.11, default python3.11),
# TF_PACKAGE (default tensorflow-cpu), TF_MATRIX_TESTS (test files, relative to
# tests/), TF_MATRIX_TIMEOUT (seconds per test file, default 900).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${TF_MATRIX_DIR:-/tmp/tf_matrix}
PYTHON=${PYTHON:-python3.11}
TF_PACKAGE=${TF_PACKAGE:-tensorflow-cpu}
TIMEOUT=${TF_MATRIX_TIMEOUT:-900}
# The default subset; files this checkout lacks are left out (older checkouts
# had keras/test_keras2_layers.py, now keras/test_keras_flavours.py).
TESTS=${TF_MATRIX_TESTS:-$(cd "$ROOT/tests" && ls ops/test_conv1d.py ops/test_conv2d.py \
  ops/test_conv3d.py ops/test_gradients.py ops/test_graph_mode.py ops/test_tf1_compat.py \
  keras/test_keras_layers.py keras/test_keras2_layers.py keras/test_keras_flavours.py \
  test_native.py 2>/dev/null)}
VERSIONS=("$@")
[[ ${#VERSIONS[@]} -gt 0 ]] || VERSIONS=(2.16.2 2.17.1 2.18.1 2.19.1 2.20.0 2.21.0)
RESULTS=$WORK/results.md
ONEDNN=${TF_ENABLE_ONEDNN_OPTS:-default}
NICE=(nice -n 10)
export TF_CPP_MIN_LOG_LEVEL=2
# The CPU wheels: no CUDA kernels, even where nvcc is installed.
export TFBIGCONV_CMAKE_ARGS=${TFBIGCONV_CMAKE_ARGS:--DTFBIGCONV_CUDA=OFF}
unset PYTHONPATH

mkdir -p "$WORK"
[[ -s $RESULTS ]] || {
  echo "| TensorFlow | Keras 3 | tf_keras | NumPy | oneDNN | build | tests passed / failed / skipped | build s | tests s |"
  echo "|---|---|---|---|---|---|---|---|---|"
} > "$RESULTS"

# The dependencies for one TF version: requirements-dev.txt's pins where TF
# accepts them. TF < 2.20 caps NumPy below the pinned 2.4 (2.16 and 2.17 below
# 2.0): for those the NumPy pin is lifted and pip picks the newest TF accepts.
requirements() {  # version
  case ${1%.*} in
    2.16|2.17|2.18|2.19) sed -E 's/^numpy==.*/numpy/' "$ROOT/requirements-dev.txt" ;;
    *) cat "$ROOT/requirements-dev.txt" ;;
  esac
  echo "$TF_PACKAGE==$1"
}

# tf-keras is released per TF minor; it names the `tensorflow` wheel as a
# dependency, so it goes in without dependencies, as in the Makefile.
tf_keras_spec() { echo "tf-keras~=${1%.*}.0"; }

# Runs one test file until it ends without crashing the interpreter, each time
# without the test that crashed it; prints "passed failed skipped crashed-ids".
run_file() {  # py src log file
  local py=$1 src=$2 log=$3 file=$4 deselect=() crashed=() xml attempt last
  xml=$(mktemp --suffix=.xml)
  for attempt in 1 2 3 4 5 6 7 8; do
    rm -f "$xml"
    echo "== $file ${deselect[*]}" >> "$log"
    (cd "$src/tests" && "${NICE[@]}" timeout "$TIMEOUT" "$py" -m pytest -v -p no:cacheprovider \
       --junitxml="$xml" "${deselect[@]}" "$file") > "$log.part" 2>&1
    cat "$log.part" >> "$log"
    [[ -s $xml ]] && break
    # pytest -v names each test before running it: the last one named, with no
    # outcome after it, is the one the interpreter died in.
    last=$(grep -oE "^$file::[^ ]+( |$)" "$log.part" | tail -1 | tr -d ' ')
    grep -qE " (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)" <(grep -F "$last " "$log.part") && last=""
    [[ -n $last && " ${crashed[*]} " != *" $last "* ]] || break
    crashed+=("$last")
    # pytest prints ids relative to tests/ but matches them relative to the root.
    deselect+=(--deselect "$last" --deselect "tests/$last")
  done
  rm -f "$log.part"
  "$py" - "$xml" "${crashed[@]}" <<'EOF'
import sys, xml.etree.ElementTree as ET
crashed = sys.argv[2:]
try:
    s = ET.parse(sys.argv[1]).getroot()
    s = s if s.tag == "testsuite" else s.find("testsuite")
    n, f, e, k = (int(s.get(a, 0)) for a in ("tests", "failures", "errors", "skipped"))
except (OSError, ET.ParseError):  # still crashing, or a timeout: the file counts as one failure
    n, f, e, k = 1, 1, 0, 0
print(n - f - e - k, f + e + len(crashed), k, " ".join(crashed) or "-")
EOF
  rm -f "$xml"
}

run_version() {  # version
  local v=$1 d=$WORK/tf-$1
  local venv=$d/venv src=$d/src py=$d/venv/bin/python
  local build=failed counts="-" build_s="-" tests_s="-" t0 tree
  mkdir -p "$d"
  requirements "$v" > "$d/requirements.txt"
  tf_keras_spec "$v" >> "$d/requirements.txt"
  # Dependencies, reinstalled when the requirements change.
  if ! cmp -s "$d/requirements.txt" "$venv/.requirements" 2>/dev/null; then
    rm -rf "$venv"
    if ! { "$PYTHON" -m venv "$venv" &&
           "$py" -m pip install -q --upgrade pip &&
           "${NICE[@]}" "$py" -m pip install -r <(grep -v '^tf-keras' "$d/requirements.txt") &&
           "${NICE[@]}" "$py" -m pip install --no-deps "$(tf_keras_spec "$v")"; } > "$d/deps.log" 2>&1; then
      report "$v" - - - "deps failed (deps.log)" - - -
      return
    fi
    cp "$d/requirements.txt" "$venv/.requirements"
  fi
  # The checkout's files (git's list, so no build outputs); built again when
  # they differ from those last built in this venv (scripts/ aside).
  (cd "$ROOT" && git ls-files -z --cached --others --exclude-standard |
     while IFS= read -r -d '' f; do [[ -e $f ]] && printf '%s\0' "$f"; done) > "$d/files"
  (cd "$ROOT" && tar --null -T "$d/files" -cf -) > "$d/src.tar"
  tree=$(cd "$ROOT" && grep -zv '^scripts/' "$d/files" | xargs -0 sha1sum | sha1sum | cut -d' ' -f1)
  local built=() && read -ra built 2>/dev/null < "$venv/.built-tree"
  if [[ -d $src && $tree == "${built[0]:-}" ]]; then
    build="ok (reused)" build_s=${built[1]}
  else
    rm -rf "$src" "$venv/.built-tree" && mkdir -p "$src" && tar -C "$src" -xf "$d/src.tar"
    t0=$SECONDS
    if (cd "$src" && "${NICE[@]}" "$py" -m pip install -v --no-build-isolation --no-deps .) \
         > "$d/build.log" 2>&1; then
      build=ok
      echo "$tree $((SECONDS - t0))" > "$venv/.built-tree"
    fi
    build_s=$((SECONDS - t0))
  fi
  rm -f "$d/src.tar" "$d/files"
  if [[ $build == ok* ]]; then
    local p=0 f=0 k=0 crashed=() file a b c ids
    : > "$d/tests.log"
    t0=$SECONDS
    for file in $TESTS; do
      read -r a b c ids < <(run_file "$py" "$src" "$d/tests.log" "$file")
      p=$((p + a)); f=$((f + b)); k=$((k + c))
      [[ $ids == - ]] || crashed+=("$ids")
    done
    tests_s=$((SECONDS - t0))
    counts="$p / $f / $k"
    [[ ${#crashed[@]} -eq 0 ]] || counts+=" (crashed: ${crashed[*]})"
  fi
  local versions
  versions=$("$py" -c "
import importlib.metadata as m
print(*(m.version(p) for p in ('keras', 'tf-keras', 'numpy')))" 2>/dev/null || echo "- - -")
  # shellcheck disable=SC2086
  report "$v" $versions "$build" "$counts" "$build_s" "$tests_s"
}

report() {  # tf keras tf_keras numpy build counts build_s tests_s
  echo "| $1 | $2 | $3 | $4 | $ONEDNN | $5 | $6 | $7 | $8 |" | tee -a "$RESULTS"
}

for v in "${VERSIONS[@]}"; do
  run_version "$v"
done

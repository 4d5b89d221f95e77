#!/usr/bin/env bash
# Run the library's tests (everything but tests/pipeline and the packaging test,
# which `make test` runs) on each newer CPython this machine has. tickwheel
# supports 3.11 and newer; `make test` runs the whole
# suite on the .venv interpreter, and this script covers the others, CPython's
# own asyncio tests from each one's test package included (CI requires them:
# .ci/run sets TICKWHEEL_REQUIRE_CPYTHON_TESTS).
#
# Interpreters: $PYTHONS (space-separated commands or paths) when set, else each
# python3.12 … python3.15 on PATH, and each of pyenv's 3.12+ builds, that runs.
# Each gets its own virtual environment under .venvs/<version>, with the test
# extra pinned in pyproject.toml (the tools; the pipeline's Spark stack is not
# needed there). Exits non-zero if any run fails, if no
# interpreter was found, or if a 3.12+ version that pyproject.toml claims (its
# classifiers) had none.
set -euo pipefail
cd "$(dirname "$0")/.."

candidates=()
if [ -n "${PYTHONS:-}" ]; then
    read -r -a candidates <<<"$PYTHONS"
else
    for minor in 12 13 14 15; do
        candidates+=("python3.$minor")
        if command -v pyenv >/dev/null 2>&1; then
            for dir in "$(pyenv root)"/versions/3."$minor".*; do
                [ -x "$dir/bin/python3" ] && candidates+=("$dir/bin/python3")
            done
        fi
    done
fi

# Install (unless a stamp newer than the project's build files says it is done) and test
# one interpreter (its venv, the test extra, the library suite); the caller captures its
# output.
test_one() {
    local py=$1 version=$2 venv=".venvs/$2" started=$SECONDS
    echo "== CPython $version ($py)"
    if [ ! -x "$venv/bin/python" ]; then
        "$py" -m venv "$venv"
    fi
    local stamp="$venv/.installed-stamp" newer
    newer=$(find pyproject.toml setup.py src -newer "$stamp" \( -name '*.py' -o -name '*.px[di]' \
        -o -name '*.pyx' -o -name '*.toml' \) -print -quit 2>/dev/null || echo missing)
    if [ ! -f "$stamp" ] || [ -n "$newer" ]; then
        # The pip each 3.12+ venv ships installs an editable pyproject project
        # (PEP 660, pip 21.3+): no upgrade first.
        "$venv/bin/python" -m pip install --quiet -e '.[test]'
        # Bytecode for the editable tree, as `make` writes it for .venv (see the Makefile).
        "$venv/bin/python" -m compileall -q src tests benchmarks examples > /dev/null
        touch "$stamp"
    fi
    local rc=0
    # The compiled core must have been built for this interpreter: its tests would
    # otherwise skip, and the wheel's build is not tested here (see below).
    if [ -z "${TICKWHEEL_NO_EXTENSIONS:-}" ]; then
        "$venv/bin/python" -c 'import sys, tickwheel; sys.exit(0 if tickwheel.COMPILED else
            "the compiled core was not built for this interpreter: see its install output")' ||
            return 1
    fi
    # tests/test_packaging.py runs once, in `make test`: what it checks is the same on
    # every interpreter (the sdist's and the wheel's files, the fall-back to pure
    # Python without a compiler), and this interpreter's own build of the compiled
    # core is the install above. (Here it cost each interpreter about 30 s.)
    "$venv/bin/python" -m pytest -n "${PYTEST_WORKERS:-2}" --dist worksteal --ignore=tests/pipeline \
        --ignore=tests/test_packaging.py -p no:cacheprovider -q || rc=$?
    echo "== CPython $version: $((SECONDS - started)) s (install and tests)"
    return $rc
}

# The interpreters run side by side: each one's suite spends about half its time
# waiting on timers and sockets, and its install compiles on one core, so two of them
# overlap well on two cores. Each one's output is shown whole once it is done.
seen=" "
failed=()
ran=0
pids=()
versions=()
mkdir -p .venvs
for py in "${candidates[@]}"; do
    # pyenv's shims exist for every version but fail for those not selected: run it to know.
    version=$("$py" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null) || continue
    case "$seen" in *" $version "*) continue ;; esac
    seen+="$version "
    ran=$((ran + 1))
    test_one "$py" "$version" >".venvs/$version.log" 2>&1 &
    pids+=($!)
    versions+=("$version")
done
for i in "${!pids[@]}"; do
    if ! wait "${pids[$i]}"; then
        failed+=("${versions[$i]}")
    fi
    cat ".venvs/${versions[$i]}.log"
done

for claimed in $(grep -o 'Python :: 3\.[0-9]*"' pyproject.toml | grep -o '3\.[0-9]*'); do
    [ "${claimed#3.}" -ge 12 ] || continue
    case "$seen" in *" $claimed."*) ;; *) failed+=("$claimed (claimed in pyproject.toml, not found)") ;; esac
done

if [ "$ran" -eq 0 ]; then
    echo "test-pythons: no CPython 3.12 or newer found (set PYTHONS=...)" >&2
    exit 1
fi
if [ ${#failed[@]} -gt 0 ]; then
    echo "test-pythons: failed on ${failed[*]}" >&2
    exit 1
fi
echo "test-pythons: passed on${seen% }"

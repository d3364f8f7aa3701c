#!/usr/bin/env bash
# Interleaved A/B of benchmarks/overhead.py between a commit and the working tree: the two alternate REPEATS times
# (commit first, then the working tree), so both see the same machine load; each run prints its own ratios.
#
#   benchmarks/compare_commits.sh COMMIT REPEATS [overhead.py arguments...]
#   OMP_NUM_THREADS=1 benchmarks/compare_commits.sh 81e4785 3 --model cnn --cnn-arch mlp --threads 1 --rounds 6 --repeats 3
#
# The commit is checked out once into a temporary git worktree (removed at exit), and this checkout's
# benchmarks/overhead.py is copied over its own, so that the same benchmark code times both versions of the library;
# both use this checkout's .venv.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
commit="$1"; repeats="$2"; shift 2
tree="$(mktemp -d)/tree"
git -C "$root" worktree add -q --detach "$tree" "$commit"
trap 'git -C "$root" worktree remove --force "$tree"' EXIT
cp "$root/benchmarks/overhead.py" "$tree/benchmarks/overhead.py"
for i in $(seq "$repeats"); do
  for side in "$tree" "$root"; do
    label=$([ "$side" = "$root" ] && echo "working tree" || echo "$commit")
    (cd "$side" && "$root/.venv/bin/python" benchmarks/overhead.py "$@" 2>&1) \
      | { grep -E "^(overhead|vectorized)|Error" || true; } | sed "s|^|[$i] $label: |"
  done
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"

#!/usr/bin/env bash
# Interleaved EMNIST driver runs of a base commit and of this checkout, for the round-time rows of
# docs/BENCHMARKS.md: `tools/driver_round_pairs.sh BASE_REV [PAIRS] [OUT]`. Each pair runs the base
# (a git worktree of BASE_REV) and this checkout with the same flags, the base first, then the next
# pair in the other order; prints each run's sum of `round_seconds` over rounds 2-8 and its wall time.
set -euo pipefail
base_rev=${1:?usage: tools/driver_round_pairs.sh BASE_REV [PAIRS] [OUT]}
pairs=${2:-8}
out=${3:-/tmp/driver_round_pairs}
here=$(cd "$(dirname "$0")/.." && pwd)
py=$here/.venv/bin/python
base=$out/base_checkout
rm -rf "$out"; mkdir -p "$out"
git -C "$here" worktree add -f --detach "$base" "$base_rev" >/dev/null
trap 'git -C "$here" worktree remove --force "$base" >/dev/null 2>&1 || true' EXIT
args=(--model=fedavg_cnn --data=synthetic --synthetic_num_clients=1000
      --synthetic_examples_per_client=16 --client_batch_size=16 --clients_per_round=50
      --mechanism=blt --num_buffers=2 --rounds=8 --min_sep=4 --noise_multiplier=1 --seed=1
      --noise_seed=3 --eval_every=100 --eval_max_examples=64)
for i in $(seq 1 "$pairs"); do
  order="base new"; [ $((i % 2)) -eq 0 ] && order="new base"
  for arm in $order; do
    dir=$here; [ "$arm" = base ] && dir=$base
    began=$(date +%s.%N)
    (cd "$dir" && "$here/tools/in_session.sh" "$py" -m experiments.emnist.run_emnist "${args[@]}" \
      --root_output_dir="$out/$arm" --experiment_name="r$i" > "$out/$arm-$i.log" 2>&1)
    ended=$(date +%s.%N)
    "$py" - "$out/$arm/r$i/metrics.csv" "$arm" "$i" "$began" "$ended" <<'PY'
import csv, sys
path, arm, pair, began, ended = sys.argv[1:]
with open(path, newline='') as f:
  seconds = [float(row['round_seconds']) for row in csv.DictReader(f)]
print(f'pair {pair} {arm}: rounds 2-8 {sum(seconds[1:]):.2f} s, wall {float(ended) - float(began):.1f} s')
PY
  done
done

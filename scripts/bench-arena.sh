#!/usr/bin/env bash
# Load time and decode tok/s of one rank whose weights live in its arena, for each arena page tier
# (--weights arena --arena-pages hugetlb|thp|4k), plus the default (--weights map: the matrices are converted
# into the arena with --arena-pages auto, the norms and the embedding stay mapped from the file's page cache,
# 4 KiB pages). Median of REPEATS runs per row, the tiers interleaved run by run so drift hits them alike,
# and every row's ratio to the 4 KiB arena measured in the same invocation.
#
# The hugetlb row needs 2 MiB pages: the script reserves them through /proc/sys/vm/nr_hugepages (root),
# under the same lock the tests take, and restores the old value on exit, whatever happens.
# Usage: scripts/bench-arena.sh [preset] [steps] [threads]      e.g. scripts/bench-arena.sh 1.1b 64 2
set -euo pipefail
cd "$(dirname "$0")/.."
PRESET=${1:-110m}
STEPS=${2:-128}
THREADS=${3:-$(nproc)}
REPEATS=${REPEATS:-5}
BIN=${BIN:-./build/shardline}
MODEL=${MODEL_DIR:-/tmp}/shardline-bench-$PRESET.bin
[ -f "$MODEL" ] || "$BIN" gen-model --preset "$PRESET" --out "$MODEL" >/dev/null 2>&1

CONTROL=/proc/sys/vm/nr_hugepages
exec 9>/tmp/shardline-hugepages.lock
flock 9
OLD_PAGES=$(cat "$CONTROL")
trap 'echo "$OLD_PAGES" > "$CONTROL"' EXIT
# The weights plus scratch, in 2 MiB pages, with room to spare.
PAGES=$(( $(stat -c %s "$MODEL") / (2 * 1024 * 1024) + 64 ))
echo $((OLD_PAGES + PAGES)) > "$CONTROL"
GOT=$(( $(cat "$CONTROL") - OLD_PAGES ))
[ "$GOT" -ge "$PAGES" ] || echo "bench-arena: the kernel granted $GOT of $PAGES hugepages; the hugetlb row will fail" >&2

declare -A FLAGS=(
  [map]="--weights map"
  [4k]="--weights arena --arena-pages 4k"
  [thp]="--weights arena --arena-pages thp"
  [hugetlb]="--weights arena --arena-pages hugetlb"
)
ROWS=(map 4k thp hugetlb)
declare -A LOADS DECODES HUGE
ARENA_KIND='arena [0-9.]* [KMG]iB ([^,]*'  # "arena 532.0 MiB (THP 2 MiB" in the --verbose placement line
HUGE=([4k]="none" [hugetlb]="all (hugetlb)")
for _ in $(seq "$REPEATS"); do
  for row in "${ROWS[@]}"; do
    # shellcheck disable=SC2086
    err=$("$BIN" run --model "$MODEL" --steps "$STEPS" --threads "$THREADS" --verbose ${FLAGS[$row]} 2>&1 >/dev/null || true)
    line=$(grep ' info: load ' <<<"$err" || true)
    [ -n "$line" ] || { echo "bench-arena: $row run failed: $(tail -1 <<<"$err")" >&2; exit 1; }
    # THP is best effort: the arena reports how much the kernel backed with 2 MiB pages (last run's figure).
    [ "$row" != thp ] || HUGE[thp]=$(grep -o '[0-9.]* [KMG]iB of [0-9.]* [KMG]iB on huge pages' <<<"$err" | head -1)
    # The default row's arena takes whatever --arena-pages auto chose: say which.
    if [ "$row" = map ]; then
      kind=$(grep -o "$ARENA_KIND" <<<"$err" | head -1)
      HUGE[map]="auto: ${kind#*(}"
    fi
    LOADS[$row]+="$(sed -n 's/.* info: load \([0-9.]*\) s.*/\1/p' <<<"$line") "
    DECODES[$row]+="$(sed -n 's/.*decode [0-9]* tok in [0-9.]* s (\([0-9.]*\) tok\/s).*/\1/p' <<<"$line") "
  done
done
median() { tr ' ' '\n' | sed '/^$/d' | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

echo "model: $PRESET ($(du -h "$MODEL" | cut -f1)), steps: $STEPS, threads: $THREADS, median of $REPEATS runs"
echo
echo "| weights | load s | decode tok/s | decode vs 4 KiB arena | arena on 2 MiB pages |"
echo "| --- | --- | --- | --- | --- |"
base=$(median <<<"${DECODES[4k]}")
for row in "${ROWS[@]}"; do
  load=$(median <<<"${LOADS[$row]}")
  decode=$(median <<<"${DECODES[$row]}")
  awk -v r="${FLAGS[$row]}" -v l="$load" -v d="$decode" -v b="$base" -v h="${HUGE[$row]}" \
    'BEGIN {printf "| `%s` | %.3f | %.1f | %.2fx | %s |\n", r, l, d, d / b, h}'
done

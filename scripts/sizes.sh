#!/usr/bin/env bash
# Sizes a newcomer can hold (issue 34): no source file over 1,000 lines outside its tests.
# Counts each tracked .rs file's lines before its unit tests (the `#[cfg(test)]` that opens
# its `mod tests { ... }` block; the whole file when it has none), in every crate and the
# fuzz targets. Files that are themselves tests are not counted: tests/**, benches/**,
# and a module's `tests.rs`. Prints one line per file over the limit and a result line;
# exits 1 when any file is over. (The other size, no function over 100 lines, is
# clippy's `too_many_lines`: Cargo.toml, clippy.toml.)
#
#   bash scripts/sizes.sh          check
#   bash scripts/sizes.sh --list   also print the ten largest files
set -euo pipefail
cd "$(dirname "$0")/.."

limit=1000
list=0
[ "${1:-}" = "--list" ] && list=1

counts=$(git ls-files -- '*.rs' \
    | grep -Ev '(^|/)(tests|benches)/|(^|/)tests\.rs$' \
    | while read -r file; do
        # Lines before the `#[cfg(test)]` whose next line (past other attributes)
        # opens `mod tests {`.
        awk -v file="$file" '
            /^#\[cfg\(test\)\]/ { if (!cfg) cfg = NR; next }
            cfg && /^#\[/ { next }
            cfg && /^(pub(\([a-z]+\))? )?mod tests \{/ { n = cfg - 1; found = 1; exit }
            { cfg = 0 }
            END { printf "%d %s\n", (found ? n : NR), file }
        ' "$file"
    done \
    | sort -rn)

files=$(printf '%s\n' "$counts" | wc -l)
over=$(printf '%s\n' "$counts" | awk -v limit="$limit" '$1 > limit')
largest=$(printf '%s\n' "$counts" | head -n 1)

if [ "$list" = 1 ]; then
    printf '%s\n' "$counts" | head -n 10
fi
if [ -n "$over" ]; then
    printf '%s\n' "$over" | awk -v limit="$limit" \
        '{ printf "sizes: %s has %d lines before its tests (limit %d): split it by job\n", $2, $1, limit }'
    echo "sizes: FAILED: $(printf '%s\n' "$over" | wc -l) of ${files} source files over ${limit} lines before their tests"
    exit 1
fi
echo "sizes: ok: ${files} source files, none over ${limit} lines before their tests (largest: ${largest#* }, ${largest%% *})"

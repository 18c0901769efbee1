#!/bin/bash
# Formats the C and C++ sources (src/, tests/, bench/) in place with
# clang-format-15 and the repository's .clang-format. With file arguments,
# formats only those. scripts/lint.sh checks that nothing would change.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
clang_format=${CLANG_FORMAT:-clang-format-15}
command -v "$clang_format" >/dev/null || { echo "$0: $clang_format not found (scripts/setup.sh installs it)" >&2; exit 1; }

if (($#)); then
  "$clang_format" -i "$@"
else
  scripts/lint.sh --list-sources | xargs -0 -r "$clang_format" -i
fi

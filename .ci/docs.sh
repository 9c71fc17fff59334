#!/usr/bin/env bash
# The book (issue 35): installs mdBook from crates.io once (cached in ~/.cache/veloxy/mdbook,
# bounded to 20 minutes) and builds docs/ into docs/book/ (ignored by git). Fails on any
# mdBook error or warning. The docs' own checks (every config key in the reference, every
# TOML example through `veloxy check`, no broken internal link) are the Rust test
# crates/veloxy/tests/docs.rs, run by `cargo test --workspace`. Called by .ci/run; run it
# alone with `bash .ci/docs.sh`. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TERM_COLOR=never

root="$HOME/.cache/veloxy/mdbook"
mdbook="$root/bin/mdbook"
if [ ! -x "$mdbook" ]; then
  echo "== installing mdbook into $root (once)"
  timeout 1200 cargo install mdbook --locked --root "$root" \
    || { echo "docs.sh: FAILED: cargo install mdbook" >&2; exit 1; }
fi
"$mdbook" --version

echo "== mdbook build docs"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
"$mdbook" build docs 2>&1 | tee "$log" || status=$?
if [ "$status" != 0 ]; then
  echo "docs.sh: FAILED: mdbook build exited $status" >&2
  exit 1
fi
# mdBook logs problems it can build past (a missing image, an unresolved link in SUMMARY.md,
# a renderer complaint) as WARN or ERROR lines and still exits 0: fail on those too.
if grep -E '(^|[[:space:]])(WARN|ERROR)([[:space:]]|$)' "$log" >/dev/null; then
  echo "docs.sh: FAILED: mdbook reported warnings or errors (above)" >&2
  exit 1
fi
[ -s docs/book/index.html ] || { echo "docs.sh: FAILED: no docs/book/index.html" >&2; exit 1; }
echo "docs.sh: book built in docs/book/ ($(find docs/book -name '*.html' | wc -l) pages)"

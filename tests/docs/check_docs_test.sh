#!/usr/bin/env bash
# The documentation checker (scripts/check-docs) on documents of its own, so that it is known to
# fail: a tree with every kind of breakage must be refused with each problem named, and a
# correct tree using every rule (whole configs, fragments, env and skip directives, anchors of
# repeated headings, links in code left alone) must pass.
#
#   tests/docs/check_docs_test.sh <scripts/check-docs> <outboxd>
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 <check-docs> <outboxd>" >&2; exit 2; }
check_docs=$1
outboxd=$2
tmp=$(mktemp -d "${TMPDIR:-/tmp}/outbox-check-docs-test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "check_docs_test: FAIL: $*" >&2; exit 1; }

# --- a correct tree: exit 0 -----------------------------------------------------------------------
good=$tmp/good
mkdir -p "$good/docs" "$good/src"
printf 'int main() {\n  return 0;\n}\n' >"$good/src/thing.cpp"
cat >"$good/README.md" <<'EOF'
# Good

See [the page](docs/page.md), [a section](docs/page.md#a-section-with-code-and-punctuation),
[the repeat](docs/page.md#repeated-1), [a folder](src/), [upstream](https://example.org/x) and
[here](#good). `[not a link](nowhere.md)` is code. <a href="docs/page.md#repeated">HTML</a>.

```sh
cat [not a link either](missing.md)
```
EOF
cat >"$good/docs/page.md" <<'EOF'
# Page

Back to the [README](../README.md) and [a file](../src/thing.cpp).

## A section, with `code` and punctuation!

## Repeated

## Repeated

An excerpt, indented differently:

<!-- excerpt: src/thing.cpp -->
```cpp
    return 0;
  }
```

A whole configuration:

```toml
[database]
type = "sqlite"
path = "app.db"

[sinks.default]
type = "file"
path = "events.jsonl"
```

A fragment, completed with the base:

```toml
[sinks.audit]
type = "file"
path = "-"
```

<!-- check-config: env OUTBOX_DATABASE_URL=postgresql://outbox@127.0.0.1/app -->
```toml
[sinks.default]
type = "file"
path = "-"
```

<!-- check-config: skip: shows a key that does not exist, on purpose -->
```toml
[relay]
no_such_key = 1
```
EOF
if ! out=$("$check_docs" --outboxd "$outboxd" --root "$good" 2>&1); then
  echo "$out" >&2
  fail "a correct tree was refused"
fi
grep -q 'check-docs: 2 pages, 8 relative links, 1 excerpts, TOML examples: 1 whole, 2 fragments with the base, 1 exempt; 0 problem(s)' <<<"$out" ||
  { echo "$out" >&2; fail "the correct tree's summary is not the expected one"; }
grep -q 'docs/page.md:.*: toml: exempt: shows a key that does not exist, on purpose' <<<"$out" ||
  { echo "$out" >&2; fail "the exemption's reason is not printed"; }

# --- a broken tree: exit 1, every problem named ---------------------------------------------------
bad=$tmp/bad
mkdir -p "$bad/docs"
cat >"$bad/README.md" <<'EOF'
# Bad

[gone](docs/missing.md), [no anchor](docs/page.md#no-such-section),
[outside](../shared/DESIGN.md), [no local anchor](#nowhere).
<img src="docs/missing.png" alt="a picture that is not there">
EOF
cat >"$bad/docs/page.md" <<'EOF'
# Page

```toml
[relay]
batch_sise = 10
```

<!-- check-config: skip -->
```toml
[relay]
batch_size = 10
```

```toml
[database]
url = "postgresql://outbox@127.0.0.1/app"

[sinks.default]
type = "carrier-pigeon"
```

<!-- excerpt: README.md -->
```
# Bad
[gone]
```

<!-- excerpt: docs/nothing.py -->
```
x
```
EOF
status=0
out=$("$check_docs" --outboxd "$outboxd" --root "$bad" 2>&1) || status=$?
[ "$status" -eq 1 ] || { echo "$out" >&2; fail "a broken tree: exit $status, expected 1"; }
expect() {
  grep -qF -- "$1" <<<"$out" || { echo "$out" >&2; fail "not reported: $1"; }
}
expect "README.md:3: link 'docs/missing.md': no such file"
expect "README.md:3: link 'docs/page.md#no-such-section': no heading with the anchor #no-such-section"
expect "README.md:4: link '../shared/DESIGN.md' leaves the repository"
expect "README.md:4: link '#nowhere': no heading with the anchor #nowhere"
expect "README.md:5: link 'docs/missing.png': no such file"
expect "docs/page.md:3: toml (fragment): outboxd --check-config exit 2:"
expect 'relay.batch_sise: unknown key (did you mean "relay.batch_size"?)'
expect "docs/page.md:9: check-config directive 'skip' is neither"
expect "docs/page.md:14: toml (whole): outboxd --check-config exit 2:"
expect "docs/page.md:23: the block is not an excerpt of 'README.md'"
expect "docs/page.md:29: excerpt of 'docs/nothing.py': no such file"
expect "10 problem(s)"
echo "check_docs_test: ok (a correct tree passes; 10 planted problems reported)"

#!/usr/bin/env bash
# Packages every published crate as `cargo publish` would, and builds each
# package from its tarball (against the others, through cargo's local
# overlay): a missing file (a Lua script, a README, a licence) or a
# dependency that only resolves inside the workspace fails here, not on
# release day. Examples and the load tool are `publish = false`.
set -euo pipefail
cd "$(dirname "$0")/.."
crates=(tollgate-limiter tollgate-memory tollgate-redis tollgate-tower tollgate-testkit tollgate tollgate-cli)
args=()
for c in "${crates[@]}"; do args+=(-p "$c"); done
# Cargo extracts each tarball once per version into the registry's source
# cache and reuses it: a package verified earlier from the same checkout
# path would hide today's sources behind yesterday's. None of these names
# is on crates.io, so every extracted copy is one of ours: drop them.
for c in "${crates[@]}"; do
    rm -rf "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/"$c"-[0-9]*
done
cargo package "${args[@]}" "$@"
# What each package ships: its scripts, README and licences.
for c in "${crates[@]}"; do
    list=$(cargo package --list --allow-dirty -p "$c" 2>/dev/null)
    for f in README.md LICENSE-MIT LICENSE-APACHE; do
        grep -qx "$f" <<<"$list" || { echo "package $c lacks $f" >&2; exit 1; }
    done
done
list=$(cargo package --list --allow-dirty -p tollgate-redis 2>/dev/null)
for lua in crates/tollgate-redis/lua/*.lua; do
    grep -qx "lua/$(basename "$lua")" <<<"$list" || { echo "tollgate-redis lacks $lua" >&2; exit 1; }
done
# Every file a shipped source includes (`include_str!`, `include_bytes!`,
# `#[path]`) is in its package: a path that climbs out of the crate
# directory builds in the workspace and nowhere else (a doctest-only
# include is not compiled by the verification above). And nothing ships
# that is only this repository's: scripts, proptest regression files.
for c in "${crates[@]}"; do
    list=$(cargo package --list --allow-dirty -p "$c" 2>/dev/null)
    dir=crates/$c
    while IFS= read -r src; do
        [[ $src == *.rs ]] || continue
        while IFS= read -r inc; do
            target=$(realpath -ms --relative-to="$dir" "$dir/$(dirname "$src")/$inc")
            grep -qx "$target" <<<"$list" || {
                echo "package $c: $src includes $inc, which is not in the package" >&2
                exit 1
            }
        done < <(grep -oE '(include_str|include_bytes)!\("[^"]+"\)|#\[path = "[^"]+"\]' "$dir/$src" |
            sed -E 's/.*"([^"]+)".*/\1/')
    done <<<"$list"
    if grep -E '\.sh$|proptest-regressions' <<<"$list"; then
        echo "package $c ships repository-only files (above)" >&2
        exit 1
    fi
done
echo "packaged: ${crates[*]}"

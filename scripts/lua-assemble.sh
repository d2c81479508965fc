# Sourced by the scripts that run tollgate's Lua on a bare redis-server
# (script-cost.sh, script-diff.sh, penalised-flood.sh): one copy of how
# crates/tollgate-redis/src/scripts.rs assembles each strategy's script.
#
#   assemble_lua DIR STRATEGY   # prints the script; DIR holds the .lua files
#
# STRATEGY: token_bucket, sliding_window or composite. The common_*.lua
# files are taken only where they exist (older commits held every helper
# in common.lua), so DIR may be an older commit's lua/ folder.
assemble_lua() {
    local dir=$1 f files
    case $2 in
        token_bucket) files="token_bucket.lua common.lua common_bucket.lua token_bucket_ops.lua" ;;
        sliding_window) files="common.lua common_window.lua sliding_window.lua" ;;
        composite) files="common.lua common_window.lua common_bucket.lua common_calendar.lua composite.lua" ;;
        *) echo "assemble_lua: unknown strategy $2" >&2; return 2 ;;
    esac
    for f in $files; do
        case $f in common_*) [ -e "$dir/$f" ] || continue ;; esac
        cat "$dir/$f"
    done
}

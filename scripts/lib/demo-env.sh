# scripts/lib/demo-env.sh — sourced first by make demo's scripts (demo.sh,
# demo-cnn.sh, demo-digits.sh).
#
# Every plover flag also reads PLOVER_<FLAG> from the environment (cli/cli.go),
# and so does the sample's client: a PLOVER_STORE in the user's shell made the
# demo deploy its samples into that store, a PLOVER_AUTH_FILE kept its server
# from starting, a PLOVER_TOKEN would be sent to it. demo_clean_env unsets every
# PLOVER_* variable except the names it is given (demo-cnn.sh and
# demo-digits.sh keep PLOVER_SERVER, which demo.sh sets to its own server).
demo_clean_env() {
  local v keep
  for v in $(compgen -e); do
    case $v in PLOVER_*) ;; *) continue ;; esac
    for keep in "$@"; do
      [ "$v" = "$keep" ] && continue 2
    done
    unset "$v"
  done
}

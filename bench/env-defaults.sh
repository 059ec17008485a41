# bench/env-defaults.sh — sourced by the bench scripts that take their settings from the environment.
#
#   env_defaults NAME=VALUE ...
#
# Sets each NAME to VALUE where the environment leaves it unset or empty (as ${NAME:-VALUE} would),
# so that a script states its settings and their defaults in one call.
env_defaults() {
  local setting name
  for setting in "$@"; do
    name=${setting%%=*}
    if [[ -z "${!name:-}" ]]; then
      printf -v "$name" '%s' "${setting#*=}"
    fi
  done
}

# Shell helpers shared by .ci/run and demo_project/demo (sourced, not run).

# find_python MIN_MINOR MAX_MINOR: print the path of the newest CPython 3.x
# with MIN_MINOR <= x <= MAX_MINOR found on PATH or under pyenv; fail quietly.
find_python() {
  local min=$1 max=$2 minor candidate
  for ((minor = max; minor >= min; minor--)); do
    for candidate in "python3.$minor" \
        $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3."$minor".*/bin/python3 2>/dev/null | sort -rV) \
        /usr/bin/python3 /usr/local/bin/python3 python3; do
      if command -v "$candidate" >/dev/null 2>&1 \
          && "$candidate" -c "import sys, venv; sys.exit(sys.version_info[:2] != (3, $minor))" 2>/dev/null; then
        command -v "$candidate"
        return 0
      fi
    done
  done
  return 1
}

# redis_answers HOST PORT: true when a Redis there answers PING.
redis_answers() {
  local reply
  exec 3<>"/dev/tcp/$1/$2" 2>/dev/null || return 1
  printf 'PING\r\n' >&3
  read -r -t 2 reply <&3 || true
  exec 3<&- 3>&-
  [[ "$reply" == "+PONG"* ]]
}

# ensure_redis_server: make sure the redis-server binary exists, installing it if needed.
ensure_redis_server() {
  command -v redis-server >/dev/null 2>&1 && return 0
  echo "redis-server not found; installing Debian's redis-server package" >&2
  apt_install redis-server
}

# apt_install PACKAGE...: install Debian packages (apt-get update once per run).
apt_install() {
  if [[ -z "${_APT_UPDATED:-}" ]]; then
    apt-get update -qq
    _APT_UPDATED=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

# port_open HOST PORT: true when something accepts TCP connections there.
port_open() {
  (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null
}

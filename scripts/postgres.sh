# Sourced by scripts/test: starts a throwaway PostgreSQL on loopback (installing the server
# when it is missing), exports PALISADE_TEST_POSTGRES_URL, and stops it on exit.
# fsync stays on: the durability tests need a real commit.

palisade_pg_bin() {
  ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1
}

palisade_start_postgres() {
  local bin
  bin=$(palisade_pg_bin)
  if [ -z "$bin" ] || [ ! -x "$bin/initdb" ]; then
    echo "PostgreSQL server not found; installing it (apt-get install -y postgresql)"
    if [ "$(id -u)" != 0 ]; then
      echo "error: installing PostgreSQL needs root; install the 'postgresql' package" >&2
      return 1
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
    bin=$(palisade_pg_bin)
  fi
  PALISADE_PG_DIR=$(mktemp -d /tmp/palisade-pg.XXXXXX)
  local run=()
  if [ "$(id -u)" = 0 ]; then
    chown postgres "$PALISADE_PG_DIR"
    run=(runuser -u postgres --)
  fi
  # A free loopback port, chosen by the kernel.
  PALISADE_PG_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  "${run[@]}" "$bin/initdb" -D "$PALISADE_PG_DIR/data" -U postgres --auth=trust >/dev/null
  "${run[@]}" "$bin/pg_ctl" -D "$PALISADE_PG_DIR/data" -w -l "$PALISADE_PG_DIR/log" \
    -o "-c listen_addresses=127.0.0.1 -p $PALISADE_PG_PORT -k $PALISADE_PG_DIR -c max_connections=300 -c fsync=on" \
    start >/dev/null
  PALISADE_PG_STOP=("${run[@]}" "$bin/pg_ctl" -D "$PALISADE_PG_DIR/data" -m fast -w stop)
  # For the tests of writes across a database restart (the server's options are kept).
  export PALISADE_TEST_POSTGRES_RESTART="${run[*]} $bin/pg_ctl -D $PALISADE_PG_DIR/data -l $PALISADE_PG_DIR/log -m fast -w restart"
  export PALISADE_TEST_POSTGRES_URL="postgres://postgres@127.0.0.1:$PALISADE_PG_PORT/postgres"
  echo "PostgreSQL $("$bin/postgres" --version | awk '{print $3}') on 127.0.0.1:$PALISADE_PG_PORT"
}

palisade_stop_postgres() {
  if [ -n "${PALISADE_PG_DIR:-}" ]; then
    "${PALISADE_PG_STOP[@]}" >/dev/null 2>&1 || true
    rm -rf "$PALISADE_PG_DIR"
    PALISADE_PG_DIR=
  fi
}

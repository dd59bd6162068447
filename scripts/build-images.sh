#!/usr/bin/env bash
# Builds the RabbitMQ and PostgreSQL images the containers environment is
# exercised with where no registry is reachable: a Debian bookworm rootfs
# (debootstrap from the machine's own Debian mirror), the server package
# installed in a chroot, imported into podman. Idempotent: existing images are
# kept. Prints the image references, pinned by digest: RabbitMQ 3.10.8,
# PostgreSQL 15, then RabbitMQ 4.0.5.
set -euo pipefail

work=${MQLAB_IMAGE_WORK:-/var/tmp/mqlab-images}
rabbit_ref=localhost/mqlab-rabbitmq
pg_ref=localhost/mqlab-postgres
mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
mirror=${mirror:-http://deb.debian.org/debian}

log() { printf '== %s\n' "$*" >&2; }

rootfs() {
  if [ ! -x "$work/base/usr/bin/apt-get" ]; then
    log "debootstrap bookworm from $mirror"
    rm -rf "$work/base"
    mkdir -p "$work"
    debootstrap --variant=minbase bookworm "$work/base" "$mirror" >&2
  fi
}

# build NAME PACKAGES... : a copy of the rootfs with the packages installed.
build() {
  local name=$1; shift
  local dir="$work/$name"
  rm -rf "$dir"
  cp -a "$work/base" "$dir"
  cp /etc/resolv.conf "$dir/etc/resolv.conf"
  printf '#!/bin/sh\nexit 101\n' > "$dir/usr/sbin/policy-rc.d"
  chmod +x "$dir/usr/sbin/policy-rc.d"
  mount -t proc proc "$dir/proc"
  trap 'umount "$dir/proc" 2>/dev/null || true' RETURN
  chroot "$dir" apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive chroot "$dir" apt-get install -y -qq --no-install-recommends "$@" >&2
  chroot "$dir" apt-get clean
  rm -f "$dir/usr/sbin/policy-rc.d"
}

digest() { podman image inspect --format '{{.Digest}}' "$1"; }

if ! podman image exists "$rabbit_ref:3.10.8"; then
  rootfs
  log "building $rabbit_ref:3.10.8"
  build rabbit rabbitmq-server
  umount "$work/rabbit/proc" 2>/dev/null || true
  tar -C "$work/rabbit" -c . | podman import \
    --change 'ENV RABBITMQ_LOGS=-' \
    --change 'ENV HOME=/var/lib/rabbitmq' \
    --change 'EXPOSE 5672' \
    --change 'CMD ["/usr/lib/rabbitmq/bin/rabbitmq-server"]' \
    - "$rabbit_ref:3.10.8" >&2
fi

if ! podman image exists "$pg_ref:15"; then
  rootfs
  log "building $pg_ref:15"
  build pg postgresql-15
  umount "$work/pg/proc" 2>/dev/null || true
  cat > "$work/pg/usr/local/bin/mqlab-postgres" <<'SH'
#!/bin/sh
# initdb on first start, then PostgreSQL in the foreground as `postgres`, trust auth.
set -e
data=/var/lib/postgresql/mqlab
if [ ! -s "$data/PG_VERSION" ]; then
  install -d -o postgres -g postgres "$data"
  setpriv --reuid=postgres --regid=postgres --init-groups -- /usr/lib/postgresql/15/bin/initdb \
    -D "$data" -U postgres --auth=trust --no-sync --no-instructions -E UTF8 --locale=C >/dev/null
  # Connections arrive through the engine's network, not from 127.0.0.1.
  echo 'host all all 0.0.0.0/0 trust' >> "$data/pg_hba.conf"
fi
install -d -o postgres -g postgres /var/run/postgresql
exec setpriv --reuid=postgres --regid=postgres --init-groups -- /usr/lib/postgresql/15/bin/postgres \
  -D "$data" -c listen_addresses='*' -c fsync=off -c full_page_writes=off
SH
  chmod +x "$work/pg/usr/local/bin/mqlab-postgres"
  tar -C "$work/pg" -c . | podman import \
    --change 'EXPOSE 5432' \
    --change 'CMD ["/usr/local/bin/mqlab-postgres"]' \
    - "$pg_ref:15" >&2
fi

# The second generation: RabbitMQ 4.0.5 from the trixie root the local
# environment runs `--rabbitmq 4.0` from (scripts/rabbitmq-4-root.sh).
if ! podman image exists "$rabbit_ref:4.0.5"; then
  root4=$(bash "$(dirname "$0")/rabbitmq-4-root.sh")
  log "building $rabbit_ref:4.0.5 from $root4"
  tar -C "$root4" --exclude=./.mqlab-ready -c . | podman import \
    --change 'ENV RABBITMQ_LOGS=-' \
    --change 'ENV HOME=/var/lib/rabbitmq' \
    --change 'EXPOSE 5672' \
    --change 'CMD ["/usr/lib/rabbitmq/bin/rabbitmq-server"]' \
    - "$rabbit_ref:4.0.5" >&2
fi

echo "$rabbit_ref@$(digest "$rabbit_ref:3.10.8")"
echo "$pg_ref@$(digest "$pg_ref:15")"
echo "$rabbit_ref@$(digest "$rabbit_ref:4.0.5")"

#!/usr/bin/env bash
# Builds the RabbitMQ 4.0 root the local environment runs `--rabbitmq 4.0`
# from: Debian trixie (rabbitmq-server 4.0.5 on Erlang/OTP 27) bootstrapped
# from the machine's own Debian mirror, the server package installed in a
# chroot. Trixie's binaries need trixie's glibc, so mqlab runs the node (and
# its epmd and rabbitmqctl) inside this root, never on the host.
# Idempotent: a complete root (its .mqlab-ready mark) is kept. Prints the
# root's path. About 45 s the first time on a 2-core machine.
set -euo pipefail

root=${MQLAB_RABBITMQ_4_ROOT:-/var/tmp/mqlab-images/rabbitmq-4.0}
mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
mirror=${mirror:-http://deb.debian.org/debian}

log() { printf '== %s\n' "$*" >&2; }

if [ ! -s "$root/.mqlab-ready" ]; then
  command -v debootstrap >/dev/null 2>&1 || {
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >&2
  }
  log "debootstrap trixie from $mirror into $root"
  rm -rf "$root"
  mkdir -p "$(dirname "$root")"
  debootstrap --variant=minbase trixie "$root" "$mirror" >&2
  cp /etc/resolv.conf "$root/etc/resolv.conf"
  printf '#!/bin/sh\nexit 101\n' > "$root/usr/sbin/policy-rc.d"
  chmod +x "$root/usr/sbin/policy-rc.d"
  log "installing rabbitmq-server in $root"
  # In a mount namespace of its own: /proc is mounted for apt there only,
  # and goes with it however the script ends.
  unshare --mount -- sh -c '
    set -e
    mount -t proc proc "$1/proc"
    chroot "$1" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive chroot "$1" apt-get install -y -qq --no-install-recommends rabbitmq-server
    chroot "$1" apt-get clean' sh "$root" >&2
  rm -f "$root/usr/sbin/policy-rc.d"
  # The package's version, as mqlab names the generation from it.
  chroot "$root" dpkg-query -W -f '${Version}\n' rabbitmq-server > "$root/.mqlab-ready"
fi
echo "$root"

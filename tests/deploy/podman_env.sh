#!/usr/bin/env bash
# Podman on a Debian 12 machine with no registry: installs podman, runc,
# mmdebstrap and podman-compose when missing, writes a containers.conf that
# works here (runc; ulimits root may set), and loads a local Debian 12 base
# image built with mmdebstrap from the mirrors apt already uses, tagged
# debian:12 so an ordinary `FROM debian:12` Dockerfile builds unchanged.
#
#   source tests/deploy/podman_env.sh
#   swarm_podman_setup        # 0: ready; 3: Podman cannot run here (reason
#                             # printed); other: a real failure. Call it as
#                             # `swarm_podman_setup || rc=$?` (it checks each
#                             # step itself, errexit being off there).
#
# Cache (outside the repo; kept between runs on one machine):
#   $SWARM_DEPLOY_CACHE (default /var/cache/swarm-deploy-test)
#     base-bookworm.tar   the mmdebstrap tarball (rebuilt when missing)
#     containers.conf
set -euo pipefail

SWARM_DEPLOY_CACHE=${SWARM_DEPLOY_CACHE:-/var/cache/swarm-deploy-test}
# catatonit: the pause process of `podman kube play` pods; the dnsname plugin:
# name resolution on user-defined networks (CNI); both are only recommended.
SWARM_PODMAN_PACKAGES=(podman runc mmdebstrap podman-compose catatonit
  golang-github-containernetworking-plugin-dnsname python3-yaml)

# The mirror lines mmdebstrap should use: what apt already uses (one-line or
# deb822 sources), for bookworm, bookworm-updates and bookworm-security.
swarm_debian_mirrors() {
  local main="" security=""
  local files=(/etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources)
  local f
  for f in "${files[@]}"; do
    [ -f "$f" ] || continue
    while read -r uri; do
      case "$uri" in
        *debian-security*) [ -z "$security" ] && security=$uri ;;
        *debian*) [ -z "$main" ] && main=$uri ;;
      esac
    done < <(sed -n -e 's/^deb \(\[[^]]*\] \)\{0,1\}\([^ ]*\) .*/\2/p' -e 's/^URIs: *\([^ ]*\).*/\1/p' "$f")
  done
  main=${main:-http://deb.debian.org/debian}
  security=${security:-http://deb.debian.org/debian-security}
  printf '%s\n' "deb $main bookworm main" "deb $main bookworm-updates main" \
    "deb $security bookworm-security main"
}

swarm_podman_setup() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "SKIP: the deploy tests need root (rootful Podman); running as uid $(id -u)"
    return 3
  fi
  local missing=() pkg
  for pkg in "${SWARM_PODMAN_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "Installing missing Debian packages: ${missing[*]}"
    if ! apt-get update >/dev/null; then
      echo "SKIP: apt-get update failed, cannot install ${missing[*]}"
      return 3
    fi
    # --no-install-recommends: podman-compose recommends docker.io.
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        "${missing[@]}" >/dev/null; then
      echo "SKIP: cannot install ${missing[*]} with apt-get"
      return 3
    fi
  fi
  mkdir -p "$SWARM_DEPLOY_CACHE"
  cat >"$SWARM_DEPLOY_CACHE/containers.conf" <<'CONF'
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[engine]
runtime = "runc"
CONF
  export CONTAINERS_CONF="$SWARM_DEPLOY_CACHE/containers.conf"
  if ! podman info >/dev/null 2>&1; then
    echo "SKIP: podman cannot run here: $(podman info 2>&1 | tail -1)"
    return 3
  fi
  if ! podman image exists localhost/debian:12; then
    local tar="$SWARM_DEPLOY_CACHE/base-bookworm.tar"
    if [ ! -s "$tar" ]; then
      echo "building the Debian 12 base image with mmdebstrap (once per machine)"
      local mirrors=()
      mapfile -t mirrors < <(swarm_debian_mirrors)
      nice -n 10 mmdebstrap --quiet --variant=minbase --format=tar bookworm "$tar.tmp" \
        "${mirrors[@]}" || { echo "deploy: mmdebstrap failed" >&2; return 1; }
      mv "$tar.tmp" "$tar" || return 1
    fi
    podman import --quiet --change 'CMD ["/bin/bash"]' "$tar" localhost/debian:12 >/dev/null ||
      { echo "deploy: podman import of $tar failed" >&2; return 1; }
  fi
  local tag
  for tag in docker.io/library/debian:12 docker.io/library/debian:bookworm \
      docker.io/library/debian:bookworm-slim; do
    podman image exists "$tag" || podman tag localhost/debian:12 "$tag" || return 1
  done
  return 0
}

#!/usr/bin/env bash
# Builds a local Ray base image without any container registry:
#
#   debootstrap Debian bookworm (Python 3.11)  ->  ray[default,serve]==2.53.0
#   from PyPI into /opt/ray-venv under Ray's own pinned dependency set
#   (docker/ray/constraints-2.53.0.txt), checked by docker/ray/check_deps.py
#   (pip check, every pin, a Serve config round trip)  ->  `docker import` as
#   argus/ray-base:2.53.0-py311, labelled with the constraints' sha256
#
# It stands in for the official rayproject/ray:2.53.0-py311 image on machines
# that cannot pull images (this project's CI machine). Both node and engine
# images are built FROM it there (BASE_IMAGE build argument), so they share the
# exact same Ray and Python, as Ray's runtime_env container plugin requires.
#
# The layout mimics the official image where it matters to Ray and the shim:
# user `ray` uid 1000 gid 100 with HOME=/home/ray and password-less sudo,
# `python` and `ray` on PATH.
#
# It also imports the bare Debian root file system, before Ray goes in, as
# argus/debian-base:bookworm (DEBIAN_TAG): the Redis, lb and Prometheus
# images need only Debian's packages and python3, and on this Docker
# (fuse-overlayfs, legacy builder) every build step walks the whole image's
# files, 23,690 on the Ray base.
#
# Cached at two levels, so a re-run is fast:
#   1. the image exists with the constraints' label -> nothing to do (FORCE=1
#      rebuilds; an image of other constraints is rebuilt)
#   2. $CACHE/ray-base-<constraints sha>-rootfs.tar exists -> only `docker import`
#   3. $CACHE/bookworm-debs.tgz exists       -> debootstrap without downloads
# Needs root (debootstrap, chroot) and Debian's and PyPI's servers.
#
# Environment: BASE_TAG (default argus/ray-base:2.53.0-py311), DEBIAN_TAG
# (default argus/debian-base:bookworm), RAY_VERSION
# (2.53.0), RAY_EXTRAS (default,serve), DEBIAN_MIRROR, CACHE (target/image-cache),
# FORCE=1.
set -euo pipefail
cd "$(dirname "$0")/.."

RAY_VERSION=${RAY_VERSION:-2.53.0}
RAY_EXTRAS=${RAY_EXTRAS:-default,serve}
BASE_TAG=${BASE_TAG:-argus/ray-base:${RAY_VERSION}-py311}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
CACHE=${CACHE:-target/image-cache}
SUITE=bookworm
DEBIAN_TAG=${DEBIAN_TAG:-argus/debian-base:$SUITE}
# sudo, with the Ray user's password-less rule, as in rayproject/ray's base
# (docker/base-deps/Dockerfile): the node image must be safe on a base that
# carries it (Dockerfile.node strips every setuid bit and the rule).
PACKAGES=python3,python3-venv,python3-pip,ca-certificates,procps,iproute2,libstdc++6,tzdata,sudo
CONSTRAINTS=docker/ray/constraints-${RAY_VERSION}.txt

start=$(date +%s)
# Each line carries the seconds since the start, so the log says where the time went.
log() { printf 'build-base-image: +%ss %s\n' "$(( $(date +%s) - start ))" "$*" >&2; }
die() { log "error: $*"; exit 1; }

command -v docker >/dev/null || die "docker CLI not found"
docker info >/dev/null 2>&1 || die "Docker daemon not reachable (is /var/run/docker.sock there and yours?)"

[ -s "$CONSTRAINTS" ] || die "no pinned dependency set for Ray $RAY_VERSION: $CONSTRAINTS"
# The image's key: the pinned dependency set and this recipe (the packages
# and the steps below), so that a changed recipe rebuilds.
pins=$( { sha256sum "$CONSTRAINTS"; sed -n '/^SUITE=/,$p' scripts/build-base-image.sh; } | sha256sum | cut -c1-16)
have=$(docker image inspect -f '{{index .Config.Labels "argus.ray.constraints"}}' "$BASE_TAG" 2>/dev/null || true)
# The Debian image's key: the suite and the package list.
debian_key=$(echo "$SUITE $PACKAGES" | sha256sum | cut -c1-16)
have_debian=$(docker image inspect -f '{{index .Config.Labels "argus.debian.packages"}}' "$DEBIAN_TAG" 2>/dev/null || true)
need_ray=1 need_debian=1
if [ "${FORCE:-0}" != 1 ]; then
  [ "$have" != "$pins" ] || need_ray=0
  [ "$have_debian" != "$debian_key" ] || need_debian=0
fi
if [ $need_ray = 0 ] && [ $need_debian = 0 ]; then
  log "$BASE_TAG already present with $CONSTRAINTS ($pins), and $DEBIAN_TAG (FORCE=1 rebuilds)"
  exit 0
fi
[ -z "$have" ] || [ $need_ray = 0 ] || log "$BASE_TAG was built from other constraints ($have, not $pins): rebuilding"

mkdir -p "$CACHE"
CACHE=$(cd "$CACHE" && pwd)
rootfs_tar="$CACHE/ray-base-${RAY_VERSION}-py311-${pins}-rootfs.tar"
debs_tgz="$CACHE/${SUITE}-debs-$(echo "$PACKAGES" | sha256sum | cut -c1-8).tgz"

import_rootfs() {
  log "docker import $rootfs_tar as $BASE_TAG"
  docker import \
    --change 'ENV PATH=/opt/ray-venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'ENV HOME=/home/ray' \
    --change 'USER ray' \
    --change 'WORKDIR /home/ray' \
    --change 'CMD ["/bin/bash"]' \
    --change "LABEL argus.ray.version=$RAY_VERSION argus.ray.constraints=$pins" \
    --message "debootstrap $SUITE + ray[$RAY_EXTRAS]==$RAY_VERSION (scripts/build-base-image.sh)" \
    "$rootfs_tar" "$BASE_TAG" >/dev/null
}

if [ $need_ray = 1 ] && [ "${FORCE:-0}" != 1 ] && [ -s "$rootfs_tar" ]; then
  import_rootfs
  need_ray=0
fi
if [ $need_ray = 0 ] && [ $need_debian = 0 ]; then
  log "done in $(( $(date +%s) - start )) s (from cached root file system)"
  exit 0
fi

[ "$(id -u)" = 0 ] || die "building the root file system needs root (debootstrap, chroot)"
if ! command -v debootstrap >/dev/null; then
  log "installing debootstrap"
  apt-get install -y debootstrap >/dev/null || { apt-get update >/dev/null && apt-get install -y debootstrap >/dev/null; }
fi

work=$(mktemp -d "$CACHE/rootfs.XXXXXX")
cleanup() {
  if mountpoint -q "$work/root/proc"; then
    umount "$work/root/proc" || { log "warning: $work/root/proc still mounted; not removing $work"; return; }
  fi
  rm -rf "$work"
}
trap cleanup EXIT

if [ ! -s "$debs_tgz" ]; then
  log "downloading $SUITE packages into $debs_tgz"
  debootstrap --variant=minbase --include="$PACKAGES" --make-tarball="$debs_tgz.part" \
    "$SUITE" "$work/dl" "$DEBIAN_MIRROR" >"$CACHE/debootstrap-download.log" 2>&1 \
    || die "debootstrap --make-tarball failed, see $CACHE/debootstrap-download.log"
  mv "$debs_tgz.part" "$debs_tgz"
  rm -rf "$work/dl"
fi

log "debootstrap $SUITE into $work/root"
debootstrap --variant=minbase --include="$PACKAGES" --unpack-tarball="$debs_tgz" \
  "$SUITE" "$work/root" "$DEBIAN_MIRROR" >"$CACHE/debootstrap.log" 2>&1 \
  || die "debootstrap failed, see $CACHE/debootstrap.log"

root="$work/root"
# The runtime's own files are provided by Docker at run time.
: >"$root/etc/resolv.conf"
echo argus-debian-base >"$root/etc/hostname"
# What debootstrap leaves of apt's downloads (every image on it runs `apt-get update` first).
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin
if [ $need_debian = 1 ]; then
  log "docker import of the bare $SUITE root file system as $DEBIAN_TAG"
  tar --numeric-owner -C "$root" -c . | docker import \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["/bin/bash"]' \
    --change "LABEL argus.debian.packages=$debian_key" \
    --message "debootstrap --variant=minbase $SUITE with $PACKAGES (scripts/build-base-image.sh)" \
    - "$DEBIAN_TAG" >/dev/null
fi
if [ $need_ray = 0 ]; then
  log "done in $(( $(date +%s) - start )) s"
  exit 0
fi
cp /etc/resolv.conf "$root/etc/resolv.conf"
# pip inside the chroot trusts what the host trusts (e.g. a proxy's CA); the
# bundle is removed again and never part of the image.
host_ca=${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}
cp "$host_ca" "$root/tmp/host-ca.crt"
mkdir -p "$root/opt/argus/ray"
cp "$CONSTRAINTS" "$root/opt/argus/ray/constraints.txt"
cp docker/ray/check_deps.py "$root/opt/argus/ray/check_deps.py"
mount -t proc proc "$root/proc"

log "installing ray[$RAY_EXTRAS]==$RAY_VERSION into /opt/ray-venv (constraints $CONSTRAINTS)"
# A clean environment: the host's PIP_*/REQUESTS_CA_BUNDLE/SSL_CERT_* would
# point pip at files of the host or at the wrong bundle inside the chroot.
env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
  chroot "$root" /bin/sh -euc "
  python3 -m venv /opt/ray-venv
  PIP_CERT=/tmp/host-ca.crt /opt/ray-venv/bin/pip install --no-cache-dir --quiet --disable-pip-version-check \
    -c /opt/argus/ray/constraints.txt 'ray[$RAY_EXTRAS]==$RAY_VERSION'
  /opt/ray-venv/bin/python /opt/argus/ray/check_deps.py --ray '$RAY_VERSION' --python 3.11 \
    --constraints /opt/argus/ray/constraints.txt
  # user as in rayproject/ray: uid 1000, gid 100 (users), HOME /home/ray
  useradd -m -s /bin/bash -d /home/ray -u 1000 -g 100 ray
  usermod -aG sudo ray
  echo 'ray ALL=NOPASSWD: ALL' >> /etc/sudoers
  apt-get clean
  rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /root/.cache
"
umount "$root/proc"
rm -f "$root/tmp/host-ca.crt"
# The runtime's own files are provided by Docker at run time.
: >"$root/etc/resolv.conf"
echo argus-ray-base >"$root/etc/hostname"

log "packing root file system"
tar --numeric-owner -C "$root" -cf "$rootfs_tar.part" .
mv "$rootfs_tar.part" "$rootfs_tar"
import_rootfs
log "done in $(( $(date +%s) - start )) s"

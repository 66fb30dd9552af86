#!/usr/bin/env bash
# Makes the Debian 12 base image the Dockerfile builds on, locally, where no
# container registry can be reached: debootstrap (minbase) from the Debian
# archive this machine's apt uses, imported into the running Docker engine.
#
#   deploy/docker/make-base-image.sh [TAG]     (default: shardline-base:bookworm)
#   docker build --build-arg BASE_IMAGE=shardline-base:bookworm ...
#
# Needs root, debootstrap and a Docker engine (DOCKER_HOST as docker uses
# it). Takes about a minute and ~200 MB.
set -euo pipefail
tag=${1:-shardline-base:bookworm}
mirror=${DEBIAN_MIRROR:-}
if [[ -z $mirror ]]; then
  mirror=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
fi
if [[ -z $mirror ]]; then
  mirror=$(awk '$1 == "deb" && $3 == "bookworm" {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
fi
mirror=${mirror:-http://deb.debian.org/debian}
for tool in debootstrap docker; do
  command -v "$tool" >/dev/null || { echo "Error: $tool is not installed" >&2; exit 2; }
done
root=$(mktemp -d /var/tmp/shardline-base.XXXXXX)
trap 'rm -rf "$root"' EXIT
echo "make-base-image: debootstrap bookworm from $mirror"
debootstrap --variant=minbase bookworm "$root" "$mirror" >"$root.log" 2>&1 || {
  tail -n 20 "$root.log" >&2
  rm -f "$root.log"
  exit 1
}
rm -f "$root.log"
# The image's apt uses the same archive (and its security updates).
cat >"$root/etc/apt/sources.list" <<SOURCES
deb $mirror bookworm main
deb $mirror bookworm-updates main
SOURCES
rm -rf "$root/var/cache/apt/archives/"*.deb "$root/var/lib/apt/lists/"*
tar -C "$root" -c . | docker import -c 'CMD ["/bin/bash"]' - "$tag" >/dev/null
echo "make-base-image: $tag"

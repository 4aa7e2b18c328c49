#!/usr/bin/env bash
# Builds the daemon's image of deploy/container/Containerfile with no registry: a Debian root made
# by debootstrap in a `buildah from scratch` container, Debian's python3, and the project's wheels
# built here. As root, with buildah and debootstrap (apt-get install buildah debootstrap) and a
# Debian mirror. Usage: deploy/container/build.sh [TAG]   (default localhost/gpuwatch:VERSION)
# Environment: GPUWATCH_DEBIAN_SUITE (bookworm), GPUWATCH_DEBIAN_MIRROR (deb.debian.org).
set -euo pipefail

repo="$(cd "$(dirname "$0")/../.." && pwd)"
suite="${GPUWATCH_DEBIAN_SUITE:-bookworm}"
mirror="${GPUWATCH_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
version="$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$repo/gpuwatch/_version.py")"
tag="${1:-localhost/gpuwatch:$version}"
python="${PYTHON:-python3}"
# buildah runs the install steps in a chroot: an OCI runtime (crun, runc) refuses some hosts'
# cgroup set-ups (hybrid v1/v2), and these steps need no more isolation than a chroot gives.
export BUILDAH_ISOLATION="${BUILDAH_ISOLATION:-chroot}"

die() { echo "build.sh: error: $*" >&2; exit 2; }
[ "$(id -u)" = 0 ] || die "run as root (debootstrap and buildah mount need it)"
for tool in buildah debootstrap; do
    command -v "$tool" >/dev/null || die "$tool is not installed: apt-get install buildah debootstrap"
done

work="$(mktemp -d)"
container=""
cleanup() {
    [ -z "$container" ] || buildah rm "$container" >/dev/null 2>&1 || true
    rm -rf "$work"
}
trap cleanup EXIT

# The project and its dependencies as wheels, so that the image installs with no index.
"$python" -m pip wheel --quiet --wheel-dir "$work/wheels" "$repo[kubernetes]"

container="$(buildah from scratch)"
root="$(buildah mount "$container")"
debootstrap --variant=minbase --include=python3,python3-venv,passwd,socat "$suite" "$root" "$mirror" \
    >"$work/debootstrap.log" || { tail -20 "$work/debootstrap.log" >&2; die "debootstrap failed"; }

cp -r "$work/wheels" "$root/tmp/wheels"
buildah run "$container" -- sh -ec '
    python3 -m venv /opt/gpuwatch
    /opt/gpuwatch/bin/pip install --quiet --no-index --no-cache-dir --find-links /tmp/wheels \
        "gpuwatch[kubernetes]"
    groupadd --gid 65529 gpuwatch
    useradd --uid 65529 --gid 65529 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin gpuwatch
'
# What a running container does not need; the runtime provides its own resolv.conf and hostname.
rm -rf "$root/tmp/wheels" "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin \
    "$root"/var/cache/apt/archives/*.deb "$root"/usr/share/man "$root"/usr/share/info \
    "$root/etc/resolv.conf" "$root/etc/hostname"
find "$root/usr/share/doc" -type f ! -name copyright -delete
buildah unmount "$container" >/dev/null

# The same settings as the Containerfile's last lines.
buildah config \
    --env PATH=/opt/gpuwatch/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --user 65529:65529 \
    --port 19400/tcp \
    --entrypoint '["/opt/gpuwatch/bin/gpuwatch", "daemon"]' \
    --cmd '["--socket=/run/gpuwatch/gpuwatch.sock", "--listen=0.0.0.0:19400"]' \
    --label org.opencontainers.image.title=gpuwatch \
    --label org.opencontainers.image.licenses=Apache-2.0 \
    "$container"
buildah commit --quiet --rm "$container" "$tag" >/dev/null
container=""
echo "built $tag"

#!/usr/bin/env bash
# Builds the stack's images with podman, on a machine that cannot pull from a registry (the tests' machines).
#
#   deploy/images.sh base                  the Debian 12 base (debootstrap --variant=minbase), once: cached
#   deploy/images.sh build [TAG] [REPO]    visioncap, visioncap-vllm-cpu, visioncap-postgres, visioncap-mosquitto
#                                          from REPO's Dockerfiles (default: this checkout) on that base, as
#                                          localhost/NAME:TAG (default: local)
#   deploy/images.sh previous [COMMIT]     the previous release's visioncap and visioncap-vllm-cpu (its source, by
#                                          `git archive COMMIT`, default $PREVIOUS_RELEASE) as localhost/NAME:previous,
#                                          for the upgrade step: this checkout's Dockerfiles, so only the layers from
#                                          the code's COPY on are new
#   deploy/images.sh sizes [TAG]           the images' sizes
#
# Every build gets BASE_IMAGE (the Debian base), this machine's package indexes and pip settings read-only (the
# project's pip indexes live on local disk here), the host network (Debian's mirror, PyPI) and podman's layer
# cache, so a rebuild after a code change rebuilds only the layers after the code's COPY. Timings go to
# test-artifacts/deploy-build-TAG.log, one line per image.
set -euo pipefail

HERE=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${VISIONCAP_DEPLOY_CACHE:-/var/cache/visioncap-deploy}
BASE=${VISIONCAP_BASE_IMAGE:-localhost/visioncap-debian:bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
PREVIOUS_RELEASE=${PREVIOUS_RELEASE:-8f66f28}
# Dockerfiles in the order they build, by image name.
IMAGES=(visioncap visioncap-vllm-cpu visioncap-postgres visioncap-mosquitto)
declare -A DOCKERFILES=(
  [visioncap]=Dockerfile
  [visioncap-vllm-cpu]=deploy/vllm-cpu.Dockerfile
  [visioncap-postgres]=deploy/postgres.Dockerfile
  [visioncap-mosquitto]=deploy/mosquitto.Dockerfile
)

base() {
  if podman image exists "$BASE"; then
    return
  fi
  local tarball=$CACHE/bookworm-minbase.tar
  mkdir -p "$CACHE"
  if [ ! -s "$tarball" ]; then
    local root=$CACHE/rootfs.partial
    rm -rf "$root"
    echo "deploy: debootstrap --variant=minbase bookworm (about a minute)"
    nice -n 10 debootstrap --variant=minbase bookworm "$root" "$MIRROR" > "$CACHE/debootstrap.log" 2>&1 \
      || { tail -20 "$CACHE/debootstrap.log"; exit 1; }
    # Package lists and caches are not part of an image: every Dockerfile runs apt-get update itself.
    rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb
    tar -C "$root" -cf "$tarball.partial" .
    mv "$tarball.partial" "$tarball"
    rm -rf "$root"
  fi
  podman import --quiet "$tarball" "$BASE" >/dev/null
  echo "deploy: imported $BASE"
}

# pip in the builds as on this machine: its settings (`pip config list`: local indexes, find-links,
# constraints) in a pip.conf of their own, its CA bundle (PyPI may be reached through a proxy with its own CA),
# and the local paths those settings name, all read-only. Absent paths are skipped.
pip_mounts() {
  local conf=$CACHE/pip-build.conf path
  {
    echo "[global]"
    pip3 config list 2>/dev/null | grep '^global\.' | grep -v '^global\.cert=' \
      | sed -E "s/^global\.([^=]+)='(.*)'$/\1 = \2/"
    echo "cert = /etc/visioncap-build/ca.crt"
  } > "$conf"
  printf -- '-v\n%s:/etc/pip.conf:ro\n' "$conf"
  printf -- '-v\n%s:/etc/visioncap-build/ca.crt:ro\n' "$(python3 -c 'import ssl; print(ssl.get_default_verify_paths().cafile or "/etc/ssl/certs/ca-certificates.crt")')"
  for path in /opt/pypi /opt/pypi-more /opt/wheels /etc/xdg/pip; do
    [ -e "$path" ] && printf -- '-v\n%s:%s:ro\n' "$path" "$path"
  done
  return 0
}

build_one() {
  local name=$1 tag=$2 repo=$3 log=$4
  local started mounts
  started=$(date +%s)
  mapfile -t mounts < <(pip_mounts)
  # The labels' version and commit: the package's version in the tree built, its commit when it is a checkout.
  local version revision
  version=$(python3 -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' \
    "$repo/pyproject.toml")
  revision=$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)
  if nice -n 10 podman build --network host --format docker --layers \
      --build-arg "BASE_IMAGE=$BASE" --build-arg "VERSION=$version" --build-arg "REVISION=$revision" "${mounts[@]}" \
      -f "$HERE/${DOCKERFILES[$name]}" -t "localhost/$name:$tag" "$repo" > "$CACHE/build-$name-$tag.log" 2>&1; then
    echo "$name $tag $(( $(date +%s) - started ))s" >> "$log"
  else
    echo "deploy: building $name failed; the end of its log ($CACHE/build-$name-$tag.log):" >&2
    tail -30 "$CACHE/build-$name-$tag.log" >&2
    return 1
  fi
}

build() {
  local tag=${1:-local} repo=${2:-$HERE}
  repo=$(cd "$repo" && pwd)
  mkdir -p "$HERE/test-artifacts" "$CACHE"
  # One build at a time: a second (CI's `make test-deploy` after the builds it started beside `make test`) waits,
  # then finds every layer cached.
  exec 9> "$CACHE/build.lock"
  flock 9
  base
  local log=$HERE/test-artifacts/deploy-build-$tag.log
  : > "$log"
  local started pids=() failed=0
  started=$(date +%s)
  # Two at a time on two cores: the big two download and unpack (I/O), the small two mostly wait on apt.
  build_one visioncap "$tag" "$repo" "$log" & pids+=($!)
  build_one visioncap-vllm-cpu "$tag" "$repo" "$log" & pids+=($!)
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  pids=()
  build_one visioncap-postgres "$tag" "$repo" "$log" & pids+=($!)
  build_one visioncap-mosquitto "$tag" "$repo" "$log" & pids+=($!)
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  echo "all $tag $(( $(date +%s) - started ))s" >> "$log"
  cat "$log"
  return "$failed"
}

previous() {
  local commit=${1:-$PREVIOUS_RELEASE}
  local src=$CACHE/previous-$commit
  mkdir -p "$HERE/test-artifacts" "$CACHE"
  exec 9> "$CACHE/build.lock"
  flock 9
  base
  if [ ! -d "$src" ]; then
    mkdir -p "$src.partial"
    git -C "$HERE" archive "$commit" | tar -x -C "$src.partial"
    mv "$src.partial" "$src"
  fi
  # This checkout's Dockerfiles install with its lock files: a release from before them gets this checkout's (they
  # are constraints: they pin what that release installs, never add to it).
  rm -rf "$src/requirements" && cp -r "$HERE/requirements" "$src/requirements"
  local log=$HERE/test-artifacts/deploy-build-previous.log pids=() failed=0 pid
  : > "$log"
  build_one visioncap previous "$src" "$log" & pids+=($!)
  build_one visioncap-vllm-cpu previous "$src" "$log" & pids+=($!)
  for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
  cat "$log"
  return "$failed"
}

sizes() {
  local tag=${1:-local} name
  for name in "${IMAGES[@]}"; do
    podman image inspect --format "$name {{.Size}}" "localhost/$name:$tag"
  done
}

case "${1:-}" in
  base) base ;;
  build) shift; build "$@" ;;
  previous) shift; previous "$@" ;;
  sizes) shift; sizes "$@" ;;
  *) echo "usage: $0 base | build [TAG] [REPO] | previous [COMMIT] | sizes [TAG]" >&2; exit 2 ;;
esac

# shellcheck shell=bash
# Sourced by the scripts in scripts/: finds (or builds, once) a Python >= 3.14.2 and the project's
# virtual environment, and runs commands inside it.
#
# Two modes:
#   host    a Python >= 3.14.2 is on PATH: the venv lives in $LLM_LANES_CACHE/venv-host.
#   chroot  otherwise: a Debian forky root made with debootstrap (it ships Python 3.14) lives in
#           $LLM_LANES_CACHE/forky; the repo is bind-mounted at /repo inside a private mount
#           namespace (so nothing stays mounted when the command ends) and the command runs in a chroot.
# Both keep everything outside the repo, so a second run reuses what the first one built.

set -euo pipefail

LLM_LANES_REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
LLM_LANES_CACHE=${LLM_LANES_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/llm_lanes}
# Build artifacts shared by both modes (llama-server builds, generated models); visible as
# $LLM_LANES_ARTIFACTS inside the environment.
LLM_LANES_ARTIFACTS_HOST="$LLM_LANES_CACHE/artifacts"
LLM_LANES_MIN_PYTHON="3.14.2"
FORKY_PACKAGES="python3.14,python3.14-venv,python3.14-dev,gcc,g++,make,cmake,libc6-dev,ca-certificates"
# System libraries a full Home Assistant start loads (scripts/develop, tests/e2e): ffmpeg for the
# voice pipeline's tts, libturbojpeg for camera (ai_task pulls it in). Without them it logs errors.
HA_DEBIAN_PACKAGES=(ffmpeg libturbojpeg0)

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

_python_ok() {
  "$1" -c "import sys; v=tuple(int(x) for x in '$LLM_LANES_MIN_PYTHON'.split('.')); sys.exit(0 if sys.version_info[:3] >= v else 1)" 2>/dev/null
}

# Prints the first Python >= 3.14.2 found on PATH, if any.
find_host_python() {
  local candidate
  for candidate in python3.16 python3.15 python3.14 python3 python; do
    if command -v "$candidate" >/dev/null 2>&1 && _python_ok "$(command -v "$candidate")"; then
      command -v "$candidate"
      return 0
    fi
  done
  return 1
}

env_mode() {
  if [ -n "${LLM_LANES_MODE:-}" ]; then
    echo "$LLM_LANES_MODE"
  elif find_host_python >/dev/null; then
    echo host
  else
    echo chroot
  fi
}

forky_root() { echo "$LLM_LANES_CACHE/forky"; }

# The Debian mirror already configured on this machine (deb822 .sources or one-line .list files).
debian_mirror() {
  local mirror=""
  if compgen -G "/etc/apt/sources.list.d/*.sources" >/dev/null; then
    mirror=$(awk '/^URIs:/ {for (i = 2; i <= NF; i++) if ($i ~ /debian\/?$/) {print $i; exit}}' \
      /etc/apt/sources.list.d/*.sources)
  fi
  if [ -z "$mirror" ]; then
    mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
      | awk '$1 == "deb" {for (i = 2; i <= NF; i++) if ($i ~ /^https?:.*debian\/?$/) {print $i; exit}}')
  fi
  echo "${mirror:-http://deb.debian.org/debian}"
}

build_forky_root() {
  local root tmp mirror
  root=$(forky_root)
  [ -f "$root/.llm_lanes-ready" ] && return 0
  [ "$(id -u)" = 0 ] || die "building the Python 3.14 root needs root (debootstrap, chroot); or put a Python >= $LLM_LANES_MIN_PYTHON on PATH"
  if ! command -v debootstrap >/dev/null 2>&1; then
    say "installing debootstrap"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
  fi
  mirror=$(debian_mirror)
  tmp="$root.partial"
  rm -rf "$tmp"
  mkdir -p "$LLM_LANES_CACHE"
  say "building a Debian forky root with Python 3.14 in $root (once; about a minute) from $mirror"
  debootstrap --variant=minbase --include="$FORKY_PACKAGES" forky "$tmp" "$mirror" \
    /usr/share/debootstrap/scripts/sid >"$LLM_LANES_CACHE/debootstrap.log" 2>&1 \
    || { tail -20 "$LLM_LANES_CACHE/debootstrap.log" >&2; die "debootstrap failed (log: $LLM_LANES_CACHE/debootstrap.log)"; }
  cp /etc/ssl/certs/ca-certificates.crt "$tmp/etc/ssl/certs/ca-certificates.crt"
  mkdir -p "$tmp/repo" "$tmp/artifacts"
  touch "$tmp/.llm_lanes-ready"
  rm -rf "$root"
  mv "$tmp" "$root"
}

# Runs "$@" at the repo root inside the environment (no venv activation needed: PATH has it first).
in_env() {
  mkdir -p "$LLM_LANES_ARTIFACTS_HOST"
  local passthrough=(TERM="${TERM:-dumb}" CI="${CI:-}" PYTEST_ADDOPTS="${PYTEST_ADDOPTS:-}")
  # An empty COLUMNS makes apt and others warn: pass it only when it has a value.
  [ -n "${COLUMNS:-}" ] && passthrough+=(COLUMNS="$COLUMNS")
  local name
  for name in $(compgen -e | grep '^LLM_LANES_' || true); do
    case "$name" in LLM_LANES_CACHE|LLM_LANES_ARTIFACTS*|LLM_LANES_REPO) ;; *) passthrough+=("$name=${!name}") ;; esac
  done
  if [ "$(env_mode)" = host ]; then
    local venv="$LLM_LANES_CACHE/venv-host"
    (cd "$LLM_LANES_REPO" && env "${passthrough[@]}" PATH="$venv/bin:$PATH" VIRTUAL_ENV="$venv" \
      LLM_LANES_ARTIFACTS="$LLM_LANES_ARTIFACTS_HOST" "$@")
  else
    local root
    root=$(forky_root)
    cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
    # LLM_LANES_CONFIG_DIR (scripts/develop --config): a folder outside the repo, seen inside at
    # the same path.
    unshare --mount --propagation private -- /bin/bash -c '
      set -e
      root=$1 repo=$2 artifacts=$3 config=$4; shift 4
      mount --bind "$repo" "$root/repo"
      mount --bind "$artifacts" "$root/artifacts"
      if [ -n "$config" ]; then mkdir -p "$root$config" && mount --bind "$config" "$root$config"; fi
      mount -t proc proc "$root/proc"
      mount --rbind /dev "$root/dev"
      mount -t tmpfs tmpfs "$root/dev/shm" 2>/dev/null || true
      exec chroot "$root" "$@"
    ' _ "$root" "$LLM_LANES_REPO" "$LLM_LANES_ARTIFACTS_HOST" "${LLM_LANES_CONFIG_DIR:-}" \
      /usr/bin/env -i HOME=/root LANG=C.UTF-8 PATH=/opt/venv/bin:/usr/local/bin:/usr/bin:/bin \
      VIRTUAL_ENV=/opt/venv LLM_LANES_ARTIFACTS=/artifacts "${passthrough[@]}" \
      /bin/sh -c 'cd /repo && exec "$@"' _ "$@"
  fi
}

# Installs Debian packages into the forky root (chroot mode) unless they are all there already.
# Forky is Debian's testing suite, whose Release files the mirror lets run past their Valid-Until
# (apt then stops at "Release file ... is expired"): the root's apt does not check that date. On a
# host Python the packages come from the system's package manager: this only says what is missing.
#   root_apt_install ffmpeg libturbojpeg0
root_apt_install() {
  local installed missing=() package
  installed=$(in_env dpkg-query -W -f='${Package} ${Status}\n' "$@" 2>/dev/null || true)
  for package in "$@"; do
    grep -qx "$package install ok installed" <<<"$installed" || missing+=("$package")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(env_mode)" != chroot ]; then
    say "missing Debian packages (install them with the system's package manager): ${missing[*]}"
    return 0
  fi
  say "installing ${missing[*]} into the Python 3.14 root"
  local apt=(env DEBIAN_FRONTEND=noninteractive apt-get -qq -o Acquire::Check-Valid-Until=false)
  in_env "${apt[@]}" update >/dev/null
  in_env "${apt[@]}" install -y --no-install-recommends "${missing[@]}" >/dev/null
}

venv_python_for_setup() {
  if [ "$(env_mode)" = host ]; then find_host_python; else echo /usr/bin/python3.14; fi
}

venv_dir() {
  if [ "$(env_mode)" = host ]; then echo "$LLM_LANES_CACHE/venv-host"; else echo "$(forky_root)/opt/venv"; fi
}

requirements_hash() {
  cat "$LLM_LANES_REPO/requirements_test.txt" "$LLM_LANES_REPO/custom_components/llm_lanes/manifest.json" \
    | sha256sum | cut -c1-16
}

env_ready() {
  local stamp
  stamp="$(venv_dir)/.llm_lanes-requirements"
  [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$(requirements_hash)" ]
}

ensure_env() {
  env_ready || "$LLM_LANES_REPO/scripts/setup"
}

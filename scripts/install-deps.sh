#!/usr/bin/env bash
# Installs the Debian packages tandem needs to build and test, only those
# missing, with sudo when not root. Safe to run repeatedly.
set -euo pipefail

packages=(
  g++ cmake ninja-build ccache pkg-config
  nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev libpcre2-dev
  libcpp-httplib-dev libstb-dev libwebp-dev libcurl4-openssl-dev libssl-dev
  clang libclang-rt-14-dev
  nodejs
)
# The OpenAI SDK client test needs npm: Debian packages it apart from nodejs,
# NodeSource's nodejs bundles it (and conflicts with Debian's).
command -v npm >/dev/null || packages+=(npm)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "installing: ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "error: not root and no sudo; install as root: apt-get install ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"

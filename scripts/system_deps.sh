#!/usr/bin/env bash
# Debian packages the test suite needs beyond Python: libfaketime (routers run under a
# shifted wall clock) and chromium (the web console's browser tests drive it headless
# through Playwright; no browser is downloaded). Installs only what is missing; without
# root it says what to install and goes on (the tests that need a package skip, or fail
# under CI=true).
set -euo pipefail
packages=(faketime chromium)
missing=()
for pkg in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "system_deps: please install: ${missing[*]} (apt-get install ${missing[*]})" >&2
  exit 0
fi
echo "system_deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null

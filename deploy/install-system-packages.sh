#!/usr/bin/env bash
# Install the Debian packages listed in deploy/system-packages.txt that are missing.
# Runs apt-get only when something is missing; needs root (or sudo) for that.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# A name counts as present when that package is installed or an installed one provides it: on Ubuntu
# 24.04, apt installs chromium as chromium-browser (the snap's transitional package, "Provides: chromium"),
# and without this every make install would run apt-get again for it.
provided=$(dpkg-query -W -f='${Status}|${Provides}\n' 2>/dev/null | sed -n 's/^install ok installed|//p' \
  | tr ',' '\n' | sed 's/([^)]*)//; s/^ *//; s/ *$//' || true)
missing=()
while read -r pkg; do
  [[ -z "$pkg" || "$pkg" == \#* ]] && continue
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" && continue
  grep -qxF "$pkg" <<<"$provided" || missing+=("$pkg")
done < "$here/system-packages.txt"
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "installing Debian packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null

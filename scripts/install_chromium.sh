#!/usr/bin/env bash
# Debian's Chromium for the playground's browser tests (make test). Playwright's own browser download needs a
# network these machines do not have, so the tests drive the system binary. Without apt-get, or without root
# (or password-less sudo), nothing is installed and the browser tests skip, saying why.
set -u
command -v chromium >/dev/null && exit 0
command -v apt-get >/dev/null || { echo "no apt-get: chromium not installed, the playground's browser tests will skip"; exit 0; }
if [ "$(id -u)" = 0 ]; then sudo=""; elif sudo -n true 2>/dev/null; then sudo="sudo -n"; else
  echo "not root: chromium not installed, the playground's browser tests will skip"; exit 0
fi
$sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null \
  || echo "apt-get could not install chromium: the playground's browser tests will skip"
exit 0

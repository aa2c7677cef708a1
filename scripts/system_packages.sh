#!/usr/bin/env bash
# System packages the test suite uses beyond Python: Debian's chromium + chromium-driver (the MLflow
# UI test drives headless Chromium). Installs them when missing and this machine allows it (apt-get,
# as root or with passwordless sudo); otherwise says what to install and exits 0: the test that
# needs them then skips, naming them, except under RECSCALE_REQUIRE_SYSTEM_PACKAGES=1 (CI), where
# it fails.
set -uo pipefail
have() { command -v "$1" >/dev/null 2>&1; }
if (have chromium || have chromium-browser) && (have chromedriver || [ -x /usr/bin/chromedriver ]); then
    exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
    if have sudo && sudo -n true 2>/dev/null; then SUDO="sudo -n"; else SUDO=none; fi
fi
if have apt-get && [ "$SUDO" != none ]; then
    echo "installing chromium and chromium-driver (Debian packages) for the MLflow UI test ..."
    if $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq \
            chromium chromium-driver >/dev/null; then
        exit 0
    fi
    echo "WARNING: apt-get could not install chromium chromium-driver" >&2
else
    echo "WARNING: chromium and chromium-driver are not installed and cannot be installed here" \
         "(needs apt-get as root or passwordless sudo)" >&2
fi
echo "WARNING: the MLflow UI test will skip; install Debian's chromium and chromium-driver to run it" >&2
exit 0

#!/usr/bin/env bash
# Java 17+, which Spark (preprocess.engine: spark, and the Spark tests) needs. Installs Debian's
# openjdk-17-jre-headless when no suitable java is found and this machine allows it (apt-get, as
# root or with passwordless sudo); otherwise says what to install and exits 0, so the rest of
# `make` goes on (the Spark tests then fail naming Java), except under
# RECSCALE_REQUIRE_SYSTEM_PACKAGES=1 (CI), where it exits 1.
set -uo pipefail
have() { command -v "$1" >/dev/null 2>&1; }
java_major() {  # major version of the java Spark would use, or 0
    local java="${JAVA_HOME:+$JAVA_HOME/bin/}java"
    "$java" -version 2>&1 | sed -n 's/.*version "\([0-9]*\)\(\.\([0-9]*\)\)\{0,1\}.*/\1 \3/p' | head -1 |
        awk '{ if ($1 == 1) print $2; else print $1 }' || true
}
major=$(java_major)
if [ -n "$major" ] && [ "$major" -ge 17 ] 2>/dev/null; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
    if have sudo && sudo -n true 2>/dev/null; then SUDO="sudo -n"; else SUDO=none; fi
fi
if have apt-get && [ "$SUDO" != none ]; then
    echo "installing openjdk-17-jre-headless (Debian) for Spark ..."
    if $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq \
            openjdk-17-jre-headless >/dev/null; then
        exit 0
    fi
    echo "WARNING: apt-get could not install openjdk-17-jre-headless" >&2
fi
echo "WARNING: Spark needs Java 17 or newer (found: ${major:-none}). Install it, e.g. on Debian or" \
     "Ubuntu: apt-get install openjdk-17-jre-headless, or set JAVA_HOME to a Java 17+." >&2
[ "${RECSCALE_REQUIRE_SYSTEM_PACKAGES:-0}" = 1 ] && exit 1
exit 0

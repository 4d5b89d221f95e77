#!/usr/bin/env bash
# Install the system packages the project needs, only when they are missing.
# Java 17 runs Spark (the pipeline).
set -euo pipefail

need=()
if ! java -version >/dev/null 2>&1; then
    need+=(openjdk-17-jre-headless)
fi

if [ ${#need[@]} -gt 0 ]; then
    echo "system-deps: installing ${need[*]}"
    if [ "$(id -u)" = 0 ]; then sudo=""; else sudo="sudo"; fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}"
fi
java -version 2>&1 | head -1

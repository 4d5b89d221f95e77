#!/usr/bin/env bash
# Install the system packages the project needs, only when they are missing.
# Java 17 runs Spark (the pipeline). The JDBC sinks use Debian's SQLite and
# PostgreSQL drivers (jars under /usr/share/java); the PostgreSQL sink tests start
# a throw-away server from Debian's postgresql package.
set -euo pipefail

need=()
if ! java -version >/dev/null 2>&1; then
    need+=(openjdk-17-jre-headless)
fi
if ! ls /usr/share/java/sqlite-jdbc*.jar >/dev/null 2>&1; then
    need+=(libxerial-sqlite-jdbc-java)
fi
if ! ls /usr/share/java/postgresql*.jar >/dev/null 2>&1; then
    need+=(libpostgresql-jdbc-java)
fi
if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    need+=(postgresql)
fi

if [ ${#need[@]} -gt 0 ]; then
    echo "system-deps: installing ${need[*]}"
    if [ "$(id -u)" = 0 ]; then sudo=""; else sudo="sudo"; fi
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}"
fi
java -version 2>&1 | head -1

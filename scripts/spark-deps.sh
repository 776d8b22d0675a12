#!/usr/bin/env bash
# Installs what gradcomp.spark needs, only what is missing: a Java runtime from Debian (openjdk-17-jre-headless, as
# root through apt-get; any working `java` on PATH is kept) and PySpark from PyPI into the project venv
# ($GRADCOMP_VENV, scripts/deps.sh). Idempotent and quick when both are there. Sourced by scripts/test.sh (so CI runs
# the Spark tests); run it directly to install them by hand: scripts/spark-deps.sh
set -euo pipefail

GRADCOMP_ROOT=${GRADCOMP_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
source "$GRADCOMP_ROOT/scripts/deps.sh"

# The PySpark line gradcomp.spark is tested with (3.5 runs on Java 17 and 21).
GRADCOMP_PYSPARK_REQUIREMENT=${GRADCOMP_PYSPARK_REQUIREMENT:-"pyspark>=3.5,<3.6"}

gradcomp_install_spark() {
  if ! java -version >/dev/null 2>&1; then
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    local jre=openjdk-17-jre-headless
    # Debian releases without Java 17 packages (13 and later) have their default JRE under this name.
    apt-cache show "$jre" >/dev/null 2>&1 || jre=default-jre-headless
    echo "[deps] installing a Java runtime for PySpark: $jre"
    # The JRE's postinst links man pages that slim images drop; the folder must exist.
    $sudo mkdir -p /usr/share/man/man1
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$jre" >/dev/null
  fi
  gradcomp_install_python
  if ! "$GRADCOMP_VENV/bin/python" -c "import pyspark" 2>/dev/null; then
    echo "[deps] installing $GRADCOMP_PYSPARK_REQUIREMENT into $GRADCOMP_VENV"
    "$GRADCOMP_VENV/bin/pip" install -q --disable-pip-version-check "$GRADCOMP_PYSPARK_REQUIREMENT"
  fi
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  gradcomp_install_spark
  java -version 2>&1 | head -1
  "$GRADCOMP_VENV/bin/python" -c "import pyspark; print('pyspark', pyspark.__version__)"
fi

#!/usr/bin/env bash
# Offline checks of deploy/ (CI runs this from ./test.sh):
#   1. the Helm chart: `helm lint --strict` and `helm template` with each
#      values file in deploy/helm/loader/ci/, every rendered object validated
#      against the Kubernetes OpenAPI schemas (1.29, the chart's minimum, and
#      1.37) and the custom resources against deploy/schemas/, plus the
#      references between objects; then a self-test that breaks manifests
#      and values in known ways and expects each break to be caught
#      (deploy/validate_chart.py);
#   2. deploy/Dockerfile, statically: no docker or buildah engine runs here,
#      so it is checked, not built (deploy/check_dockerfile.py);
#   3. the chart's copy of the Grafana dashboard equals deploy/grafana's.
# No Kubernetes API server is involved. Tools come from PyPI (pinned in
# deploy/requirements.txt) into target/deploy-venv: helm-python-sdk bundles
# Helm's Go SDK as a shared library, kubernetes-validate the schemas. The
# first run downloads about 100 MB; later runs reuse the virtualenv.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
start=$SECONDS

venv="$root/target/deploy-venv"
reqs="$root/deploy/requirements.txt"
stamp="$venv/.requirements.sha256"
want="$(sha256sum "$reqs" | cut -d' ' -f1)"
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  python="${PYTHON:-python3}"
  if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "deploy/check.sh: needs Python >= 3.11 (found $("$python" --version 2>&1)); set PYTHON" >&2
    exit 1
  fi
  mkdir -p "$root/target"
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --only-binary=:all: -r "$reqs"
  echo "$want" > "$stamp"
fi

# The apt lookups of the Dockerfile's packages need apt's lists; a fresh
# machine may have none.
if command -v apt-cache >/dev/null 2>&1 && ! apt-cache show libjpeg62-turbo >/dev/null 2>&1 \
   && [ "$(id -u)" = 0 ]; then
  apt-get update -qq
fi

status=0
if ! cmp -s deploy/grafana/loader-dashboard.json deploy/helm/loader/dashboards/loader-dashboard.json; then
  echo "FAIL deploy/helm/loader/dashboards/loader-dashboard.json differs from deploy/grafana/loader-dashboard.json (copy it over)"
  status=1
fi

"$venv/bin/python" deploy/check_dockerfile.py --self-test || status=1
"$venv/bin/python" deploy/validate_chart.py deploy/helm/loader \
  --crd-schemas deploy/schemas --kube-versions 1.29,1.37 \
  --self-test --out target/deploy-rendered || status=1

echo "deploy/check.sh: $((SECONDS - start)) s; rendered manifests in target/deploy-rendered/"
exit $status

#!/usr/bin/env bash
# Adds deploy/coredns/Corefile.stanza to CoreDNS's Corefile (ConfigMap kube-system/coredns),
# pointed at the ClusterIP of mcs-system/mcs-dataplane-dns. Idempotent: a Corefile that already
# has a clusterset.local block is left alone. Needs kubectl and python3; extra arguments go to
# kubectl (e.g. --context).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ip="$(kubectl "$@" -n mcs-system get service mcs-dataplane-dns -o jsonpath='{.spec.clusterIP}')"
[[ -n "${ip}" ]] || { echo "no ClusterIP on mcs-system/mcs-dataplane-dns" >&2; exit 1; }
corefile="$(kubectl "$@" -n kube-system get configmap coredns -o jsonpath='{.data.Corefile}')"
if grep -q '^clusterset.local' <<<"${corefile}"; then
  echo "the Corefile already serves clusterset.local" >&2
  exit 0
fi
stanza="$(grep -v '^#' "${here}/Corefile.stanza" | sed "s/MCS_DNS_IP/${ip}/g")"
python3 - "${corefile}" "${stanza}" >"${TMPDIR:-/tmp}/coredns-patch.json" <<'PY'
import json, sys
print(json.dumps({"data": {"Corefile": sys.argv[1].rstrip() + "\n" + sys.argv[2].strip() + "\n"}}))
PY
kubectl "$@" -n kube-system patch configmap coredns --type=merge --patch-file "${TMPDIR:-/tmp}/coredns-patch.json"
echo "CoreDNS forwards clusterset.local to ${ip}"

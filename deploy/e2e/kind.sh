#!/usr/bin/env bash
# End-to-end test on two kind clusters: builds the agent image, creates the clusters "east" and
# "west" with routed pod networks, installs the product in both (CRDs, RBAC, the remote read-only
# identity, the admission policy, the node DaemonSet and the controller Deployment with each
# cluster's ClusterSet config), then runs
#   1. the mcs-api conformance suite (kubernetes-sigs/mcs-api/conformance, both clusters), and
#   2. the strict-port connectivity cases: traffic to a ClusterSet IP and port reaches only the
#      clusters whose Service declares that exact port (KEP-1645 after
#      kubernetes/enhancements#5706), and an undeclared port is refused;
#   3. clusterset.local DNS through CoreDNS: the import's name, its SRV record and the PTR of
#      its ClusterSet IP resolve from a pod (CoreDNS forwards the zone to the agents'
#      Service, deploy/coredns/add-stanza.sh).
#
# NOT RUN ON THE PROJECT'S BUILD MACHINES: they have no Docker engine (so no kind) and no
# network beyond package registries. It was written to be correct by reading; run it on a
# workstation with: docker (engine), kind >= 0.27, kubectl >= 1.30, go >= 1.23, git, and
# internet access (kind node image, test images, the mcs-api repository).
#
# Usage: deploy/e2e/kind.sh [up|test|down|all]   (default: all = up, test, down on success)
# Environment:
#   KEEP=1                  keep the clusters after `all`, even on success
#   MCS_API_REF=<git ref>   mcs-api revision for the conformance suite (default: main)
#   CONFORMANCE_LABELS=...  ginkgo label filter (default: '!DNS && !Connectivity'; the DNS
#                           cases need the CoreDNS stanza, which `install` adds: set '' to run them)
#   IMAGE=...               image to build and load (default: mcs-dataplane:e2e)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# Scratch space (kubeconfigs, overlays, the mcs-api clone); outside deploy/ because kustomize
# refuses an overlay inside its base, and at a fixed depth for the relative base path below.
WORK="${ROOT}/target/e2e-kind"
IMAGE="${IMAGE:-mcs-dataplane:e2e}"
# name@digest, or name[:tag] where a tag follows the last ':' after the last '/' (a
# registry's port is not a tag).
if [[ "${IMAGE}" == *@* ]]; then IMAGE_NAME="${IMAGE%@*}" IMAGE_REF="digest: ${IMAGE#*@}"
elif [[ "${IMAGE##*/}" == *:* ]]; then IMAGE_NAME="${IMAGE%:*}" IMAGE_REF="newTag: ${IMAGE##*:}"
else IMAGE_NAME="${IMAGE}" IMAGE_REF="newTag: latest"; fi
MCS_API_REF="${MCS_API_REF:-main}"
CONFORMANCE_LABELS="${CONFORMANCE_LABELS-!DNS && !Connectivity}"
CLUSTERS=(east west)
declare -A POD_CIDR=([east]=10.10.0.0/16 [west]=10.20.0.0/16)
declare -A SVC_CIDR=([east]=10.110.0.0/16 [west]=10.120.0.0/16)

log() { printf '\n=== %s\n' "$*" >&2; }
die() { printf 'FAIL: %s\n' "$*" >&2; exit 1; }
ctx() { echo "kind-mcs-$1"; }
kc() { local c="$1"; shift; kubectl --context "$(ctx "$c")" "$@"; }
other() { if [[ "$1" == east ]]; then echo west; else echo east; fi; }
node_ip() { docker inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}' "mcs-$1-control-plane"; }

# Retries "$@" until it succeeds, for up to $1 seconds.
retry() {
  local timeout="$1"; shift
  local deadline=$((SECONDS + timeout))
  until "$@"; do
    ((SECONDS < deadline)) || return 1
    sleep 2
  done
}

build_image() {
  log "building ${IMAGE}"
  docker build -f "${ROOT}/deploy/Dockerfile" -t "${IMAGE}" "${ROOT}"
}

create_clusters() {
  mkdir -p "${WORK}"
  for c in "${CLUSTERS[@]}"; do
    if kind get clusters | grep -qx "mcs-${c}"; then
      log "cluster mcs-${c} exists"
      continue
    fi
    log "creating cluster mcs-${c}"
    cat >"${WORK}/kind-${c}.yaml" <<EOF
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
networking:
  podSubnet: ${POD_CIDR[$c]}
  serviceSubnet: ${SVC_CIDR[$c]}
EOF
    kind create cluster --name "mcs-${c}" --config "${WORK}/kind-${c}.yaml" --wait 120s
  done
  # Route each cluster's pod network to the other's node (both are on docker's "kind" network),
  # so endpoints imported from the other cluster are reachable.
  for c in "${CLUSTERS[@]}"; do
    local o; o="$(other "$c")"
    docker exec "mcs-${c}-control-plane" ip route replace "${POD_CIDR[$o]}" via "$(node_ip "$o")"
  done
  for c in "${CLUSTERS[@]}"; do
    kind load docker-image "${IMAGE}" --name "mcs-${c}"
  done
}

# Whether the read-only identity's token Secret of cluster $1 holds its token yet (the Secret
# exists before the token controller fills it).
reader_token_ready() {
  test -n "$(kc "$1" -n mcs-system get secret mcs-dataplane-remote-reader -o jsonpath='{.data.token}' 2>/dev/null)"
}

# A kubeconfig for the read-only identity of cluster $1, addressed from inside the other cluster.
reader_kubeconfig() {
  local c="$1" token ca
  retry 60 reader_token_ready "$c"
  token="$(kc "$c" -n mcs-system get secret mcs-dataplane-remote-reader -o jsonpath='{.data.token}' | base64 -d)"
  ca="$(kc "$c" -n mcs-system get secret mcs-dataplane-remote-reader -o jsonpath='{.data.ca\.crt}')"
  cat <<EOF
apiVersion: v1
kind: Config
clusters:
- name: ${c}
  cluster:
    server: https://$(node_ip "$c"):6443
    certificate-authority-data: ${ca}
contexts:
- name: ${c}
  context: {cluster: ${c}, user: reader}
current-context: ${c}
users:
- name: reader
  user:
    token: ${token}
EOF
}

install() {
  for c in "${CLUSTERS[@]}"; do
    log "installing the read-only identity in ${c}"
    kc "$c" apply -f "${ROOT}/deploy/remote/reader.yaml"
    # The cluster id, as KEP-2149 has it. The config below leaves localCluster out, so the
    # agent reads it from here.
    kc "$c" apply -f - <<'EOF'
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: clusterproperties.about.k8s.io
spec:
  group: about.k8s.io
  scope: Cluster
  names: {kind: ClusterProperty, plural: clusterproperties, singular: clusterproperty}
  versions:
  - name: v1alpha1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            required: [value]
            properties:
              value: {type: string, maxLength: 128000}
EOF
    retry 60 kc "$c" get crd clusterproperties.about.k8s.io -o name >/dev/null
    kc "$c" wait --for=condition=Established crd/clusterproperties.about.k8s.io --timeout=60s
    kc "$c" apply -f - <<EOF
apiVersion: about.k8s.io/v1alpha1
kind: ClusterProperty
metadata: {name: cluster.clusterset.k8s.io}
spec: {value: ${c}}
EOF
  done
  for c in "${CLUSTERS[@]}"; do
    local o; o="$(other "$c")"
    log "installing the agent in ${c}"
    local dir="${WORK}/${c}"
    mkdir -p "${dir}"
    reader_kubeconfig "$o" >"${dir}/${o}.kubeconfig"
    cat >"${dir}/clusterset.yaml" <<EOF
members:
- id: ${c}
- id: ${o}
  kubeconfig: /etc/mcs-dataplane/members/${o}.kubeconfig
ipFamilyPolicy: Intersection
unreachableGracePeriod: 1m
memberProbeInterval: 5s
EOF
    # An overlay of deploy/: this cluster's config, the remote kubeconfig (mounted by the
    # controller Deployment only), the e2e image (a tag replaces the base's digest).
    cat >"${dir}/kustomization.yaml" <<EOF
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- ../../../deploy
configMapGenerator:
- name: mcs-dataplane-config
  namespace: mcs-system
  behavior: replace
  files:
  - clusterset.yaml
secretGenerator:
- name: mcs-dataplane-members
  namespace: mcs-system
  files:
  - ${o}.kubeconfig
images:
- name: mcs-dataplane
  newName: ${IMAGE_NAME}
  ${IMAGE_REF}
EOF
    # CRDs first, so the rest of the kustomization (and the policy) resolve.
    kc "$c" apply -f "${ROOT}/deploy/crds/"
    kc "$c" wait --for=condition=Established crd/serviceexports.multicluster.x-k8s.io crd/serviceimports.multicluster.x-k8s.io --timeout=60s
    kc "$c" apply -k "${dir}"
    # The image is loaded into the nodes, never pulled.
    kc "$c" -n mcs-system patch daemonset mcs-dataplane --type=json -p \
      '[{"op":"add","path":"/spec/template/spec/containers/0/imagePullPolicy","value":"Never"},
        {"op":"add","path":"/spec/template/spec/initContainers/0/imagePullPolicy","value":"Never"}]'
    kc "$c" -n mcs-system patch deployment mcs-dataplane-controller --type=json -p \
      '[{"op":"add","path":"/spec/template/spec/containers/0/imagePullPolicy","value":"Never"}]'
  done
  for c in "${CLUSTERS[@]}"; do
    kc "$c" -n mcs-system rollout status daemonset/mcs-dataplane --timeout=180s
    kc "$c" -n mcs-system rollout status deployment/mcs-dataplane-controller --timeout=180s
    retry 60 lease_held "$c" || die "no controller lease in ${c}"
    log "${c}: CoreDNS forwards clusterset.local to the agents"
    "${ROOT}/deploy/coredns/add-stanza.sh" --context "$(ctx "$c")"
  done
}

# Resolves clusterset.local names of the echo import through CoreDNS from cluster $1's client.
dns_resolves() {
  local c="$1" ip="$2" name="echo.${NS}.svc.clusterset.local"
  # CoreDNS reloads its Corefile within a minute.
  retry 120 sh -c "kubectl --context $(ctx "$c") -n ${NS} exec client -- nslookup ${name} 2>/dev/null | grep -q '${ip}'" \
    || die "${c}: ${name} does not resolve to ${ip} through CoreDNS"
  kc "$c" -n "${NS}" exec client -- nslookup -type=srv "_http._tcp.${name}" | tee /dev/stderr \
    | grep -q "80 ${name}" || die "${c}: no SRV record for _http._tcp.${name}"
  kc "$c" -n "${NS}" exec client -- nslookup "${ip}" | tee /dev/stderr \
    | grep -q "${name}" || die "${c}: no PTR record for ${ip}"
}

lease_held() {
  [[ -n "$(kc "$1" -n mcs-system get lease mcs-dataplane-controller -o jsonpath='{.spec.holderIdentity}' 2>/dev/null)" ]]
}

conformance() {
  log "mcs-api conformance suite (${MCS_API_REF}), label filter: ${CONFORMANCE_LABELS:-<none>}"
  local src="${WORK}/mcs-api"
  if [[ ! -d "${src}" ]]; then
    git clone --quiet https://github.com/kubernetes-sigs/mcs-api "${src}"
  fi
  git -C "${src}" fetch --quiet origin "${MCS_API_REF}"
  git -C "${src}" checkout --quiet FETCH_HEAD
  # The first context is the "remote" cluster that exports.
  (cd "${src}/conformance" && go test -v -timeout 60m . -args \
      -contexts="$(ctx east),$(ctx west)" \
      -ginkgo.label-filter="${CONFORMANCE_LABELS}" \
      -ginkgo.v)
  log "conformance report: ${src}/conformance/report.html"
}

# --- strict-port connectivity -------------------------------------------------------------

NS=mcs-e2e-strict-ports

deploy_echo() {
  local c="$1" admin_port="$2"
  kc "$c" create namespace "${NS}" --dry-run=client -o yaml | kc "$c" apply -f -
  kc "$c" -n "${NS}" apply -f - <<EOF
apiVersion: apps/v1
kind: Deployment
metadata: {name: echo-${c}}
spec:
  replicas: 2
  selector: {matchLabels: {app: echo}}
  template:
    metadata: {labels: {app: echo}}
    spec:
      containers:
      - name: netexec
        image: registry.k8s.io/e2e-test-images/agnhost:2.53
        args: ["netexec", "--http-port=8080"]
        ports: [{containerPort: 8080, name: web}]
---
apiVersion: v1
kind: Service
metadata: {name: echo}
spec:
  selector: {app: echo}
  ports:
  - {name: http, protocol: TCP, port: 80, targetPort: 8080}
  - {name: admin, protocol: TCP, port: ${admin_port}, targetPort: 8080}
---
apiVersion: v1
kind: Pod
metadata: {name: client}
spec:
  containers:
  - name: client
    image: busybox:1.36
    command: ["sleep", "86400"]
EOF
  kc "$c" -n "${NS}" rollout status deployment/"echo-${c}" --timeout=120s
  kc "$c" -n "${NS}" wait --for=condition=Ready pod/client --timeout=120s
}

export_echo() {
  kc "$1" -n "${NS}" apply -f - <<'EOF'
apiVersion: multicluster.x-k8s.io/v1beta1
kind: ServiceExport
metadata: {name: echo}
EOF
}

vip() { kc "$1" -n "${NS}" get serviceimport echo -o jsonpath='{.spec.ips[0]}'; }

import_has_ports() {
  local got
  got="$(kc "$1" -n "${NS}" get serviceimport echo -o jsonpath='{range .spec.ports[*]}{.name}:{.port} {end}' 2>/dev/null)"
  [[ "${got}" == "$2" ]]
}

conflict_is() {
  local got
  got="$(kc "$1" -n "${NS}" get serviceexport echo -o jsonpath='{.status.conditions[?(@.type=="Conflict")].reason}' 2>/dev/null)"
  [[ "${got}" == "$2" ]]
}

# Hostnames that answer `count` requests to vip:port from cluster $1's client pod.
responders() {
  local c="$1" addr="$2" count="$3"
  for _ in $(seq "${count}"); do
    kc "$c" -n "${NS}" exec client -- wget -qO- -T 2 "http://${addr}/hostname" 2>/dev/null || echo FAILED
    echo
  done | grep -v '^$' | sort -u
}

strict_ports() {
  log "strict-port connectivity"
  deploy_echo east 9000
  deploy_echo west 9001
  export_echo east
  # Creation timestamps have seconds granularity: make east the oldest export.
  sleep 2
  export_echo west
  for c in "${CLUSTERS[@]}"; do
    # The oldest export's admin:9000 wins; west's admin:9001 is dropped and both exports
    # report PortConflict.
    retry 60 import_has_ports "$c" "http:80 admin:9000 " || die "${c}: import ports"
    retry 60 conflict_is "$c" PortConflict || die "${c}: no PortConflict on the export"
    local ip; ip="$(vip "$c")"
    [[ -n "${ip}" ]] || die "${c}: the import has no ClusterSet IP"
    # Give the node role a moment to program the imported slices of both clusters.
    retry 60 sh -c "[ \"\$(kubectl --context $(ctx "$c") -n ${NS} exec client -- wget -qO- -T 2 http://${ip}:9000/hostname 2>/dev/null)\" != '' ]" \
      || die "${c}: ${ip}:9000 never answered"
    log "${c}: echo.${NS}.svc.clusterset.local resolves through CoreDNS"
    dns_resolves "$c" "${ip}"

    log "${c}: ${ip}:80 is declared by both clusters"
    local r80; r80="$(responders "$c" "${ip}:80" 40)"
    echo "${r80}"
    grep -q '^echo-east-' <<<"${r80}" || die "${c}: no east backend answered on :80"
    grep -q '^echo-west-' <<<"${r80}" || die "${c}: no west backend answered on :80"
    grep -q FAILED <<<"${r80}" && die "${c}: a request to :80 failed"

    log "${c}: ${ip}:9000 is declared by east only"
    local r9000; r9000="$(responders "$c" "${ip}:9000" 40)"
    echo "${r9000}"
    grep -q '^echo-west-' <<<"${r9000}" && die "${c}: west answered on :9000, which it does not declare"
    grep -q FAILED <<<"${r9000}" && die "${c}: a request to :9000 failed"

    log "${c}: ${ip}:9001 is not a port of the import: refused at connect"
    if kc "$c" -n "${NS}" exec client -- wget -qO- -T 2 "http://${ip}:9001/hostname"; then
      die "${c}: ${ip}:9001 accepted a connection"
    fi
  done

  log "west unexports: east's imports route to east only"
  kc west -n "${NS}" delete serviceexport echo
  retry 60 conflict_is east NoConflicts || die "east: the conflict did not clear"
  local ip; ip="$(vip east)"
  retry 60 sh -c "! kubectl --context $(ctx east) -n ${NS} get endpointslices -l multicluster.kubernetes.io/source-cluster=west -o name | grep -q ." \
    || die "east: west's imported slices were not removed"
  local r; r="$(responders east "${ip}:80" 30)"
  echo "${r}"
  grep -q '^echo-west-' <<<"${r}" && die "east: west still answers after unexporting"
  grep -q '^echo-east-' <<<"${r}" || die "east: east stopped answering"
  kc east -n "${NS}" get events --field-selector involvedObject.kind=ServiceExport
}

down() {
  for c in "${CLUSTERS[@]}"; do
    kind delete cluster --name "mcs-${c}" || true
  done
}

main() {
  local what="${1:-all}"
  case "${what}" in
    up) build_image; create_clusters; install ;;
    test) conformance; strict_ports ;;
    down) down ;;
    all)
      build_image; create_clusters; install
      conformance
      strict_ports
      log "PASS"
      [[ "${KEEP:-0}" == 1 ]] || down
      ;;
    *) die "usage: $0 [up|test|down|all]" ;;
  esac
}

main "$@"

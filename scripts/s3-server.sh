#!/usr/bin/env bash
# s3-server.sh: a real, throw-away, single-node Ceph RGW S3 server on 127.0.0.1 for tests and CI.
#
# Usage:
#   scripts/s3-server.sh start  DIR [PORT]  # install Ceph if missing, bring up mon + memstore OSD + radosgw,
#                                           # print `export AWS_...` lines on stdout (PORT default 7480,
#                                           # 0 = any free port). Already running -> print them again, exit 0.
#   scripts/s3-server.sh stop   DIR         # stop the daemons this script started (by their pids in DIR)
#   scripts/s3-server.sh status DIR         # say what runs; exit 0 only if all daemons run and S3 answers
#
#   eval "$(scripts/s3-server.sh start /tmp/rgw)"
#   VLP_TEST_S3_ENDPOINT=$AWS_ENDPOINT_URL .venv/bin/python -m pytest -q tests/test_storage.py
#   scripts/s3-server.sh stop /tmp/rgw
#
# Everything (config, mon/osd data, logs, sockets, pid files) lives under DIR; objects live in memory (memstore),
# so a stopped server forgets them and the next start bootstraps a fresh cluster. Installing needs root (or sudo)
# and `apt-get` (Debian/Ubuntu packages radosgw, ceph-mon, ceph-osd). Progress and errors go to stderr.
#
# Environment: S3_SERVER_ACCESS_KEY (default vlp-test-access), S3_SERVER_SECRET_KEY (default vlp-test-secret),
# S3_SERVER_TIMEOUT (seconds for the whole start, default 90), S3_SERVER_MEMSTORE_MB (OSD capacity, default 2048),
# S3_SERVER_NO_INSTALL=1 (fail instead of installing missing packages).
#
# Why these settings: auth is off, and with auth off radosgw hangs for 300 s fetching its config from the monitor
# unless all four `ms * mode` options are `crc`; pool size 1 and chooseleaf type 0 let one OSD hold every PG.
set -euo pipefail

ACCESS_KEY="${S3_SERVER_ACCESS_KEY:-vlp-test-access}"
SECRET_KEY="${S3_SERVER_SECRET_KEY:-vlp-test-secret}"
TIMEOUT="${S3_SERVER_TIMEOUT:-90}"
MEMSTORE_MB="${S3_SERVER_MEMSTORE_MB:-2048}"
RGW_NAME="client.rgw.s3"
DAEMONS=(rgw osd mon) # stop order; start order is the reverse

log() { printf 's3-server: %s\n' "$*" >&2; }
die() {
  log "ERROR: $*"
  exit 1
}

usage() {
  sed -n '2,13p' "$0" >&2
  exit 2
}

# --- paths under DIR -------------------------------------------------------------------------------------------

set_paths() {
  [[ -n "$1" ]] || usage
  mkdir -p "$1"
  DIR="$(cd "$1" && pwd -P)"
  [[ "$DIR" != "/" ]] || die "refusing to use / as DIR"
  CONF="$DIR/ceph.conf"
  PIDS="$DIR/pids"
  LOGS="$DIR/log"
  ENV_FILE="$DIR/env.sh"
}

pid_of() { # pid of our daemon $1, if its pid file names a live process started with our config
  local f="$PIDS/$1.pid" pid
  [[ -s "$f" ]] || return 1
  pid="$(<"$f")"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  [[ -r "/proc/$pid/cmdline" ]] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$CONF" || return 1
  echo "$pid"
}

log_file() { # the log that explains daemon $1
  case "$1" in
  mon) echo "$LOGS/mon.a.log" ;;
  osd) echo "$LOGS/osd.0.log" ;;
  rgw) echo "$LOGS/$RGW_NAME.log" ;;
  esac
}

fail_with_logs() { # die after showing the tail of the logs of daemons "$2..."
  local msg="$1" d f
  shift
  for d in "$@"; do
    for f in "$(log_file "$d")" "$LOGS/$d.out"; do
      [[ -s "$f" ]] || continue
      log "---- last lines of $f ----"
      tail -n 25 "$f" >&2 || true
    done
  done
  stop_daemons
  die "$msg (logs in $LOGS; daemons stopped)"
}

# --- installation ------------------------------------------------------------------------------------------------

ensure_installed() {
  local missing=() c sudo=()
  for c in ceph ceph-mon ceph-osd radosgw radosgw-admin monmaptool ceph-authtool python3; do
    command -v "$c" >/dev/null 2>&1 || missing+=("$c")
  done
  ((${#missing[@]} == 0)) && return 0
  [[ "${S3_SERVER_NO_INSTALL:-}" != 1 ]] || die "missing ${missing[*]} and S3_SERVER_NO_INSTALL=1"
  command -v apt-get >/dev/null || die "missing ${missing[*]}; install Ceph (radosgw ceph-mon ceph-osd) by hand"
  if ((EUID != 0)); then
    command -v sudo >/dev/null || die "missing ${missing[*]}; run as root or install radosgw ceph-mon ceph-osd"
    sudo=(sudo -n)
  fi
  log "installing radosgw ceph-mon ceph-osd (missing: ${missing[*]}) ..."
  local t0=$SECONDS
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    radosgw ceph-mon ceph-osd python3 >&2
  log "installed in $((SECONDS - t0)) s"
}

# --- small helpers (python3 comes with ceph-common) ----------------------------------------------------------

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

port_is_free() {
  python3 - "$1" <<'PY'
import socket, sys
s = socket.socket()
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError:
    sys.exit(1)
PY
}

s3_probe() { # s3_probe PORT [ACCESS SECRET]: HTTP status of GET / (signed with SigV2 when keys are given)
  python3 - "$@" <<'PY'
import base64, hashlib, hmac, sys, urllib.error, urllib.request
from email.utils import formatdate
port, keys = sys.argv[1], sys.argv[2:]
req = urllib.request.Request(f"http://127.0.0.1:{port}/")
if keys:
    date = formatdate(usegmt=True)
    sig = hmac.new(keys[1].encode(), f"GET\n\n\n{date}\n/".encode(), hashlib.sha1).digest()
    req.add_header("Date", date)
    req.add_header("Authorization", f"AWS {keys[0]}:{base64.b64encode(sig).decode()}")
try:
    with urllib.request.urlopen(req, timeout=3) as resp:
        resp.read()
        print(resp.status)
except urllib.error.HTTPError as e:
    print(e.code)
except OSError:
    print(0)
PY
}

ceph_cli() { timeout 15 ceph -c "$CONF" --connect-timeout 10 "$@"; }

remaining() { echo $((DEADLINE - SECONDS)); }

wait_for() { # wait_for WHAT DAEMON CMD...: poll CMD until it succeeds or the start deadline passes
  local what="$1" daemon="$2"
  shift 2
  until "$@" >/dev/null 2>&1; do
    if ! pid_of "$daemon" >/dev/null; then
      fail_with_logs "$daemon exited while waiting for $what" "$daemon"
    fi
    ((SECONDS < DEADLINE)) || fail_with_logs "timed out after ${TIMEOUT} s waiting for $what" "$daemon" mon
    sleep 0.5
  done
}

spawn() { # spawn NAME CMD...: run a daemon in the foreground of its own session, remember its pid
  local name="$1"
  shift
  setsid "$@" </dev/null >"$LOGS/$name.out" 2>&1 &
  echo $! >"$PIDS/$name.pid"
}

# --- bring-up ------------------------------------------------------------------------------------------------

write_conf() {
  local fsid="$1" mon_port="$2" port="$3"
  cat >"$CONF" <<EOF
# generated by scripts/s3-server.sh: throw-away single-node test cluster, do not use for anything real
[global]
fsid = $fsid
mon host = [v2:127.0.0.1:$mon_port]
public addr = 127.0.0.1
ms bind ipv4 = true
ms bind ipv6 = false
auth cluster required = none
auth service required = none
auth client required = none
ms mon client mode = crc
ms mon cluster mode = crc
ms client mode = crc
ms cluster mode = crc
run dir = $DIR/run
crash dir = $DIR/crash
log file = $LOGS/\$name.log
keyring = $DIR/keyring
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon warn on pool no redundancy = false
mon data avail warn = 2
paxos propose interval = 0.1
mon data avail crit = 1
mon cluster log file = $LOGS/\$cluster.\$channel.log

[mon]
mon data = $DIR/mon/\$cluster-\$id

[osd]
osd data = $DIR/osd/\$cluster-\$id
osd objectstore = memstore
memstore device bytes = $((MEMSTORE_MB * 1024 * 1024))
osd crush update on start = false

[$RGW_NAME]
rgw frontends = beast endpoint=127.0.0.1:$port
rgw data = $DIR/rgw
rgw thread pool size = 64
EOF
}

clean_state() { # remove what a previous run of this script left in DIR (and nothing else)
  rm -rf "${DIR:?}/mon" "$DIR/osd" "$DIR/rgw" "$DIR/run" "$DIR/crash" "$LOGS" "$PIDS" \
    "$CONF" "$DIR/keyring" "$DIR/monmap" "$ENV_FILE" "$DIR/port"
  mkdir -p "$DIR/mon/ceph-a" "$DIR/osd/ceph-0" "$DIR/rgw" "$DIR/run" "$DIR/crash" "$LOGS" "$PIDS"
}

osd_is_up() { ceph_cli osd stat -f json | grep -q '"num_up_osds":1'; }
pgs_active() { ! ceph_cli pg stat | grep -qE 'creating|peering|activating|unknown|down'; }
http_answers() { [[ "$(s3_probe "$1")" =~ ^[1-5][0-9][0-9]$ ]]; }
user_works() { [[ "$(s3_probe "$1" "$ACCESS_KEY" "$SECRET_KEY")" == 200 ]]; }
user_create() {
  timeout 30 radosgw-admin -c "$CONF" --no-mon-config user create --uid=s3-test --display-name="S3 test user" \
    --access-key="$ACCESS_KEY" --secret-key="$SECRET_KEY" >"$LOGS/user-create.out" 2>&1
}

print_env() {
  cat "$ENV_FILE"
}

start() {
  local port="${1:-7480}" fsid osd_uuid mon_port t0=$SECONDS
  [[ "$port" =~ ^[0-9]+$ ]] || die "PORT must be a number, got '$port'"
  if all_running; then
    local running
    running="$(<"$DIR/port")"
    [[ "$port" == 0 || "$port" == "$running" ]] || die "already running in $DIR on port $running, not $port"
    log "already running on port $running"
    print_env
    return 0
  fi
  ensure_installed
  stop_daemons
  clean_state
  [[ "$port" != 0 ]] || port="$(free_port)"
  port_is_free "$port" || die "port $port on 127.0.0.1 is in use; pass another PORT (0 = any free one)"
  mon_port="$(free_port)"
  fsid="$(</proc/sys/kernel/random/uuid)"
  osd_uuid="$(</proc/sys/kernel/random/uuid)"
  DEADLINE=$((SECONDS + TIMEOUT))
  write_conf "$fsid" "$mon_port" "$port"
  echo "$port" >"$DIR/port"

  log "monitor on 127.0.0.1:$mon_port ..."
  ceph-authtool --create-keyring "$DIR/keyring" --gen-key -n mon. --cap mon 'allow *' >"$LOGS/setup.out" 2>&1
  monmaptool --create --fsid "$fsid" --addv a "[v2:127.0.0.1:$mon_port]" "$DIR/monmap" >>"$LOGS/setup.out" 2>&1
  ceph-mon -c "$CONF" --mkfs -i a --monmap "$DIR/monmap" --keyring "$DIR/keyring" >>"$LOGS/setup.out" 2>&1 ||
    fail_with_logs "ceph-mon --mkfs failed: $(tail -n 5 "$LOGS/setup.out")" mon
  spawn mon ceph-mon -c "$CONF" -f -i a
  wait_for "the monitor to answer" mon ceph_cli mon stat

  log "memstore OSD ..."
  ceph_cli osd new "$osd_uuid" >>"$LOGS/setup.out" 2>&1 || fail_with_logs "ceph osd new failed" mon
  ceph-osd -c "$CONF" -i 0 --mkfs --osd-uuid "$osd_uuid" >>"$LOGS/setup.out" 2>&1 ||
    fail_with_logs "ceph-osd --mkfs failed: $(tail -n 5 "$LOGS/setup.out")" osd
  ceph_cli osd crush add osd.0 1.0 root=default >>"$LOGS/setup.out" 2>&1 ||
    fail_with_logs "adding osd.0 to the CRUSH map failed" mon
  spawn osd ceph-osd -c "$CONF" -f -i 0
  wait_for "osd.0 to come up" osd osd_is_up

  log "radosgw on 127.0.0.1:$port ..."
  spawn rgw radosgw -c "$CONF" -n "$RGW_NAME" --no-mon-config -f
  wait_for "radosgw to answer HTTP on port $port" rgw http_answers "$port"
  user_create || fail_with_logs "radosgw-admin user create failed: $(tail -n 5 "$LOGS/user-create.out")" rgw
  wait_for "signed S3 requests as $ACCESS_KEY to succeed" rgw user_works "$port"

  cat >"$ENV_FILE" <<EOF
export AWS_ENDPOINT_URL=http://127.0.0.1:$port
export AWS_ACCESS_KEY_ID=$ACCESS_KEY
export AWS_SECRET_ACCESS_KEY=$SECRET_KEY
export AWS_DEFAULT_REGION=us-east-1
EOF
  log "ready in $((SECONDS - t0)) s: http://127.0.0.1:$port (stop: $0 stop $DIR)"
  print_env
}

# --- stop / status -------------------------------------------------------------------------------------------

all_running() {
  local d
  [[ -s "$DIR/port" && -s "$ENV_FILE" ]] || return 1
  for d in "${DAEMONS[@]}"; do pid_of "$d" >/dev/null || return 1; done
}

stop_daemons() { # TERM our daemons (radosgw first), wait up to 20 s each, then KILL
  local d pid i
  [[ -d "${PIDS:-}" ]] || return 0
  for d in "${DAEMONS[@]}"; do
    if pid="$(pid_of "$d")"; then
      kill -TERM "$pid" 2>/dev/null || true
      for ((i = 0; i < 200; i++)); do
        [[ -e "/proc/$pid" ]] || break
        sleep 0.1
      done
      if [[ -e "/proc/$pid" ]]; then
        log "$d (pid $pid) ignored SIGTERM; killing it"
        kill -KILL "$pid" 2>/dev/null || true
      fi
      log "stopped $d (pid $pid)"
    fi
    rm -f "$PIDS/$d.pid"
  done
}

status() {
  local d pid port="" ok=0
  [[ -s "$DIR/port" ]] && port="$(<"$DIR/port")"
  for d in mon osd rgw; do
    if pid="$(pid_of "$d")"; then
      echo "$d: running (pid $pid, $(awk '/VmRSS/ {print $2 " kB resident"}' "/proc/$pid/status"))"
    else
      echo "$d: not running"
      ok=1
    fi
  done
  if [[ -n "$port" ]] && command -v python3 >/dev/null && user_works "$port"; then
    echo "s3: http://127.0.0.1:$port answers signed requests as $ACCESS_KEY"
  else
    echo "s3: not answering${port:+ on port $port}"
    ok=1
  fi
  return "$ok"
}

main() {
  (($# >= 2)) || usage
  local cmd="$1"
  set_paths "$2"
  case "$cmd" in
  start)
    (($# <= 3)) || usage
    start "${3:-}"
    ;;
  stop)
    (($# == 2)) || usage
    stop_daemons
    ;;
  status)
    (($# == 2)) || usage
    status
    ;;
  *) usage ;;
  esac
}

main "$@"

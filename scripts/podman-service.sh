#!/usr/bin/env bash
# podman's Docker-compatible API on a socket of its own, for kfp.local's DockerRunner (make pipeline-run
# RUNNER=container) and any docker client:
#   scripts/podman-service.sh start DIR   # prints `export DOCKER_HOST=unix://DIR/podman.sock`
#   scripts/podman-service.sh stop DIR
# It installs podman and runc from Debian when missing (as scripts/image-test.sh installs podman), and runs the
# service with DIR/containers.conf (CONTAINERS_CONF), which makes containers start on machines like this one:
#   - runtime runc: crun refuses a host with hybrid cgroups (v1 controllers and a v2 hierarchy both mounted);
#   - default ulimits no higher than this shell's hard limits (and nproc no higher than kernel.pid_max): podman's
#     defaults (nofile 1048576, nproc 4194304) exceed them, and the runtime's setrlimit fails ("Operation not
#     permitted").
# Nothing outside DIR is written; `stop` ends the service and removes the socket.
set -euo pipefail
cmd=${1:?usage: scripts/podman-service.sh start|stop DIR}
dir=${2:?usage: scripts/podman-service.sh start|stop DIR}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
sock="$dir/podman.sock"
pidfile="$dir/podman.pid"

case "$cmd" in
stop)
  if [ -s "$pidfile" ] && kill "$(cat "$pidfile")" 2> /dev/null; then
    for _ in $(seq 50); do kill -0 "$(cat "$pidfile")" 2> /dev/null || break; sleep 0.1; done
  fi
  rm -f "$pidfile" "$sock"
  echo "podman-service: stopped" >&2
  exit 0
  ;;
start) ;;
*) echo "usage: scripts/podman-service.sh start|stop DIR" >&2; exit 2 ;;
esac

for tool in podman runc; do
  command -v "$tool" > /dev/null || {
    echo "podman-service: installing podman and runc (apt)" >&2
    apt-get update -q > /dev/null && apt-get install -y -q podman runc > /dev/null
  }
done

nofile=$(ulimit -Hn); nproc=$(ulimit -Hu); pid_max=$(cat /proc/sys/kernel/pid_max)
[ "$nofile" = unlimited ] && nofile=1048576
[ "$nproc" = unlimited ] || [ "$nproc" -gt "$pid_max" ] && nproc=$pid_max  # above pid_max runc's setrlimit fails here
cat > "$dir/containers.conf" <<CONF
# Written by scripts/podman-service.sh for the service on $sock.
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=$nproc:$nproc"]

[engine]
runtime = "runc"
CONF

if [ -s "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2> /dev/null; then
  echo "podman-service: already running (pid $(cat "$pidfile"))" >&2
else
  rm -f "$sock"
  CONTAINERS_CONF="$dir/containers.conf" nohup podman system service --time=0 "unix://$sock" \
    > "$dir/podman.log" 2>&1 &
  echo $! > "$pidfile"
  for _ in $(seq 100); do
    curl -sf --unix-socket "$sock" http://d/_ping > /dev/null 2>&1 && break
    kill -0 "$(cat "$pidfile")" 2> /dev/null || { echo "podman-service: the service died:" >&2; cat "$dir/podman.log" >&2; exit 1; }
    sleep 0.1
  done
  curl -sf --unix-socket "$sock" http://d/_ping > /dev/null || { echo "podman-service: no answer on $sock" >&2; exit 1; }
  echo "podman-service: podman $(podman --version | awk '{print $3}') (runc) on $sock" >&2
fi
echo "export DOCKER_HOST=unix://$sock"

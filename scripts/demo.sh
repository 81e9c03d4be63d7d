#!/usr/bin/env bash
# make demo: the whole story on demo/service.c, a multi-threaded C service.
# Build it instrumented, make it cold, run it under the runtime, then turn
# probes on and off from outside while it serves, and read what they record.
set -euo pipefail
cd "$(dirname "$0")/.."
out=out/demo
mkdir -p "$out"
rm -f "$out/stop"

bold= plain=
if [ -t 1 ]; then bold=$(tput bold 2>/dev/null || true) plain=$(tput sgr0 2>/dev/null || true); fi
step() { printf '\n%s== %s%s\n' "$bold" "$*" "$plain"; }
# show echoes a command on stderr (stdout may be redirected) and runs it.
show() { printf '$ %s\n' "$*" >&2; "$@"; }

if [ "$(id -u)" != 0 ] && [ "$(cat /proc/sys/kernel/yama/ptrace_scope 2>/dev/null || echo 0)" != 0 ]; then
	echo "demo: hotpatch needs ptrace rights over the service: run as root, or set kernel.yama.ptrace_scope=0" >&2
	exit 1
fi

pid=
finish() {
	[ -n "$pid" ] && kill "$pid" 2>/dev/null || true
}
trap finish EXIT

step "1. Build the service with -finstrument-functions (every function calls the cyg hooks)"
show gcc -O2 -g -pthread -finstrument-functions demo/service.c -o "$out/service"

step "2. coldpatch: make every hook site inert (one byte each) and keep the probe list"
show bin/coldpatch --summary "$out/service" > "$out/probes.json"
echo "probe list: $out/probes.json ($(grep -c '"id"' "$out/probes.json") probes)"

step "3. Run the cold service under the runtime, as production would"
printf '$ LD_PRELOAD=bin/libedgeprobe.so %s %s &\n' "$out/service" "$out/stop"
LD_PRELOAD=bin/libedgeprobe.so "$out/service" "$out/stop" > "$out/service.log" &
pid=$!
until grep -q "serving" "$out/service.log" 2>/dev/null; do sleep 0.05; done
cat "$out/service.log"

step "4. hotpatch list: every probe is off, read live from the process"
show bin/hotpatch list --pid "$pid" --probes "$out/probes.json"

step "5. Turn handle_request and lookup on, from outside, while every thread runs"
show bin/hotpatch --pid "$pid" --probes "$out/probes.json" --enable handle_request --enable lookup -v
sleep 1

step "6. What the probes recorded: calls and latency per function, live"
show bin/hotpatch stats --pid "$pid"

step "7. A trace of parse_request and hash_key (Perfetto / chrome://tracing)"
show bin/hotpatch trace --pid "$pid" --probes "$out/probes.json" --enable parse_request --enable hash_key \
	--duration 200ms --max-calls 200000 -o "$out/trace.json"

step "8. The bursty latency profiler over every function: <= 500 calls per function per 50ms epoch"
show bin/hotpatch profile --pid "$pid" --probes "$out/probes.json" --duration 2s --samples 500 --epoch 50ms \
	-o "$out/service.pprof" --top 8
show go tool pprof -top "$out/service.pprof"

step "9. Turn everything off again; the service never stopped"
show bin/hotpatch --pid "$pid" --probes "$out/probes.json" --disable '*'
before=$(bin/hotpatch stats --pid "$pid" --json | grep -o '"entries": [0-9]*' | awk '{s+=$2} END {print s}')
sleep 0.5
after=$(bin/hotpatch stats --pid "$pid" --json | grep -o '"entries": [0-9]*' | awk '{s+=$2} END {print s}')
echo "recorded calls: $before, half a second later: $after (probes off: no new calls recorded)"
show bin/hotpatch list --pid "$pid" --probes "$out/probes.json"

step "10. Stop the service: it served every request, whatever was patched meanwhile"
touch "$out/stop"
wait "$pid"
pid=
cat "$out/service.log"
echo
echo "demo: done. Files in $out/: probes.json, trace.json (open in https://ui.perfetto.dev), service.pprof"

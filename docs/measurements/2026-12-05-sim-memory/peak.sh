#!/usr/bin/env bash
# peak.sh LIMIT_KB CMD... : runs CMD (own process group), prints the largest RssAnon (kB) of smpimain seen (0.5 s
# samples); kills the group once it passes LIMIT_KB.
limit=$1; shift
setsid "$@" & pid=$!
peak=0; start=$SECONDS
while kill -0 $pid 2>/dev/null; do
  for p in $(pgrep smpimain); do
    a=$(awk '/^RssAnon:/{print $2}' /proc/$p/status 2>/dev/null); a=${a:-0}
    [ "$a" -gt "$peak" ] && peak=$a
  done
  if [ "$peak" -gt "$limit" ]; then kill -9 -- -$pid; echo "killed at $((SECONDS-start)) s"; break; fi
  sleep 0.5
done
wait $pid 2>/dev/null
echo "peak RssAnon ${peak} kB after $((SECONDS-start)) s"

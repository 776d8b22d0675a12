#!/usr/bin/env bash
# peak2.sh LIMIT_KB CMD...: as peak.sh, but kills the smpimain processes themselves at the limit (tmpfs.sh's
# namespace keeps them out of the launcher's process group).
limit=$1; shift
"$@" & pid=$!
peak=0; start=$SECONDS
while kill -0 $pid 2>/dev/null; do
  for p in $(pgrep smpimain); do
    a=$(awk '/^RssAnon:/{print $2}' /proc/$p/status 2>/dev/null); a=${a:-0}
    [ "$a" -gt "$peak" ] && peak=$a
  done
  if [ "$peak" -gt "$limit" ]; then pkill -9 smpimain; echo "killed at $((SECONDS-start)) s"; break; fi
  sleep 0.5
done
wait $pid 2>/dev/null
pkill -9 smpimain
echo "peak RssAnon ${peak} kB after $((SECONDS-start)) s"

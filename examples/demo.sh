#!/bin/sh
# Demo: launch a job under ckpt, checkpoint it, kill it, restart it from the
# image and watch it finish with the right answer.  The job writes to
# job.log; the restarted process goes on writing that file from where the
# checkpoint was taken.
set -eu
cd "$(dirname "$0")/.."
work=$(mktemp -d /tmp/ckpt-demo.XXXXXX)
trap 'rm -rf "$work"' EXIT
gcc -O2 -o "$work/demo" examples/demo.c
CKPT="./bin/ckpt"
log="$work/job.log"

echo "== ckpt launch --job-id demo -- demo > job.log   (in the background)"
$CKPT launch --job-id demo --ckpt-dir "$work/images" -- "$work/demo" > "$log" &
launcher=$!
sleep 2.2
echo "== ckpt checkpoint demo"
image=$($CKPT checkpoint demo | tail -n 1)
echo "   image: $image"
sleep 1
echo "== ckpt kill demo; job.log so far:"
$CKPT kill demo
wait $launcher || true
sed 's/^/   /' "$log"
echo "== ckpt images $work/images/demo"
$CKPT images "$work/images/demo"
echo "== ckpt restart $image"
status=0
$CKPT restart "$image" || status=$?
echo "== the restarted job ended with status $status; job.log now:"
sed 's/^/   /' "$log"
grep -q "sum of squares 1..60 = 73810" "$log"
echo "== demo ok: the job went on from its checkpoint and finished right"

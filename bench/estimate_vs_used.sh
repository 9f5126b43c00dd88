#!/bin/bash
# usage: measure.sh WORKTREE  — 500 short rows through the loopback provider, estimate vs used
set -e
WT=$1; D=$(mktemp -d)
python3 -c "print('word'); [print(f'w{i}') for i in range(500)]" > $D/rows.csv
PORT=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
$WT/.venv/bin/python -c "
import time,sys; from hermes_bulk.testing.fake_provider import FakeProvider
p=FakeProvider(port=$PORT).start() if 'port' in FakeProvider.__init__.__code__.co_varnames else FakeProvider().start()
open('$D/url','w').write(p.base_url); time.sleep(120)" & PP=$!
for i in $(seq 50); do [ -s $D/url ] && break; sleep 0.2; done
export HERMES_BULK_HOME=$D/home HERMES_BULK_BASE_URL=$(cat $D/url) HERMES_BULK_MODEL=fake-model HERMES_BULK_API_KEY=sk-test
HB="$WT/.venv/bin/python -m hermes_bulk"
J=$($HB create "Translate to French" --over $D/rows.csv --json | $WT/.venv/bin/python -c 'import json,sys;print(json.load(sys.stdin)["job_id"])')
E0=$($HB status $J --json | $WT/.venv/bin/python -c 'import json,sys;print(json.load(sys.stdin)["estimated_tokens"])')
$HB run $J --wait --concurrency 2 >/dev/null 2>&1 & RP=$!
MID=""
while kill -0 $RP 2>/dev/null; do
  L=$($HB status $J --json | $WT/.venv/bin/python -c 'import json,sys;j=json.load(sys.stdin);print(j["completed"], j["estimated_tokens"])')
  set -- $L; if [ "$1" -ge 25 ] && [ -z "$MID" ]; then MID="estimate with $1/500 done: $2"; fi; sleep 0.1
done
echo "$MID"
$HB status $J --json | $WT/.venv/bin/python -c "
import json,sys; j=json.load(sys.stdin); used=j['tokens_in']+j['tokens_out']
print(f'estimate at create {$E0}, estimate after {j[\"estimated_tokens\"]}, used {used}, ratio at create {$E0/used:.2f}, ratio after {j[\"estimated_tokens\"]/used:.2f}')"
kill $PP

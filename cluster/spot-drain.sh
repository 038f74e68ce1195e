#!/usr/bin/env bash
# On an AWS spot node: tell Ray when AWS announces the reclaim (instance metadata, two minutes ahead), so Ray Train
# sees a preemption (its budget, not run.max_failures) and restarts the group from the newest checkpoint on what
# is left. Started in the background by cluster/aws.yaml's worker_start_ray_commands.
set -u
imds=http://169.254.169.254/latest
while true; do
  token=$(curl -s -X PUT "$imds/api/token" -H "X-aws-ec2-metadata-token-ttl-seconds: 300" || true)
  notice=$(curl -s -f -H "X-aws-ec2-metadata-token: $token" "$imds/meta-data/spot/instance-action" || true)
  if [ -n "$notice" ]; then
    at=$(python3 -c 'import json,sys,datetime as d; t=json.loads(sys.argv[1])["time"]; print(int((d.datetime.fromisoformat(t.replace("Z","+00:00"))-d.datetime.now(d.timezone.utc)).total_seconds()))' "$notice")
    ray drain-node --reason DRAIN_NODE_REASON_PREEMPTION --reason-message "AWS spot reclaim" \
      --deadline-remaining-seconds "$((at > 5 ? at - 5 : 1))"
    exit 0
  fi
  sleep 5
done

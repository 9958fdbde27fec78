#!/bin/sh
# One random password per Kafka user of docker-compose.acl.yml (its `secrets:`), each
# in compose/secrets/NAME, which git ignores. A file that exists is kept, so running
# it again changes nothing; delete a file and rerun to change that password (the
# kafka-acls step applies it at the next `up`). Letters and digits only: kafka-configs
# reads the password inside `SCRAM-SHA-512=[password=...]`.
set -eu
cd "$(dirname "$0")"
umask 077
mkdir -p secrets
chmod 700 secrets
for name in $(sed -n 's|^ *file: \./secrets/\([A-Za-z0-9_-]*\)$|\1|p' docker-compose.acl.yml); do
  f="secrets/$name"
  if [ ! -s "$f" ]; then
    LC_ALL=C tr -dc 'A-Za-z0-9' </dev/urandom | head -c 32 >"$f"
  fi
  # the containers' own users (Kafka's appuser, rltune's uid 10001) read the mounted
  # file; the directory (0700) keeps other users of this host out
  chmod 644 "$f"
done
echo "passwords in $(pwd)/secrets/"

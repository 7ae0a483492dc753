#!/bin/bash
# One-shot provisioning (runs as root in the `provision` container): the
# project CA stays in the `ca` volume; each site's key.pem, cert.pem and
# ca.crt go to that site's own volume (/tls/<site>), the operator's admin
# identity to /tls/operator. Files are handed to the daemon's user (uid
# 10001); keys keep mode 0600. Does nothing when every identity exists,
# unless ROTATE names sites to re-issue ("site-2", "site-1 site-3") or is
# "all". The CA is reused, so peers keep trusting re-issued certificates.
set -euo pipefail
JOB=/etc/swarm/job.json
SITES=$(sed -n 's/.*"name": *"\([^"]*\)".*/\1/p' "$JOB")
ROTATE=${ROTATE:-}
issue=()
for site in $SITES; do
  if [ "$ROTATE" = all ] || [[ " $ROTATE " == *" $site "* ]] ||
     [ ! -s "/tls/$site/cert.pem" ]; then
    issue+=(--site "$site")
  fi
done
admin=()
[ -s /tls/operator/cert.pem ] || admin=(--admin operator)
if [ "${#issue[@]}" -eq 0 ] && [ "${#admin[@]}" -eq 0 ]; then
  echo "provision: every identity exists (set ROTATE=site-N or all to re-issue)"
  exit 0
fi
[ "${#issue[@]}" -eq 0 ] && issue=(--no-sites)
swarmctl provision --out /pki --job "$JOB" "${admin[@]}" "${issue[@]}"
for site in $SITES; do
  [ -d "/pki/sites/$site" ] || continue
  cp "/pki/sites/$site/key.pem" "/pki/sites/$site/cert.pem" "/pki/sites/$site/ca.crt" "/tls/$site/"
  chown 10001:10001 "/tls/$site"/*
  chmod 0600 "/tls/$site/key.pem"
done
if [ -d /pki/admins/operator ]; then
  cp /pki/admins/operator/* /tls/operator/
  chown 10001:10001 /tls/operator/*
  chmod 0600 /tls/operator/key.pem
fi
rm -rf /pki/sites /pki/admins   # only the CA stays in the ca volume
echo "provision: issued ${issue[*]:-no site} ${admin[*]:-}"

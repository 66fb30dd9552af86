#!/usr/bin/env bash
# Development certificates for a Shardline cluster's mutual TLS: a CA (made
# once, kept in DIR) and a certificate and key per daemon signed by it.
#
#   deploy/certs.sh DIR NAME [SAN ...]
#
# writes DIR/ca.pem and DIR/ca.key (when DIR has none), DIR/NAME.pem and
# DIR/NAME.key. The certificate names NAME, localhost and 127.0.0.1, plus
# each SAN given ("worker1.example.net", "10.0.0.7", "DNS:x", "IP:y"): every
# name the daemon is dialled by (its --advertise_host, the coordinator's
# address as workers and shardctl write it). Each daemon then runs with
#   --tls_cert=DIR/NAME.pem --tls_key=DIR/NAME.key --tls_ca=DIR/ca.pem
# and shardctl with a certificate of its own (deploy/certs.sh DIR shardctl).
# Rotation: run it again for NAME (a new key and certificate over the old
# files); the daemons read them again within --tls_refresh_s. A new CA:
# put both CAs in the ca.pem every daemon reads, re-issue, then drop the old.
# For production, issue certificates from your own CA the same way (EC P-256,
# serverAuth and clientAuth: every daemon is both).
set -euo pipefail
if [[ $# -lt 2 ]]; then
  echo "usage: $0 DIR NAME [SAN ...]" >&2
  exit 2
fi
dir=$1
name=$2
shift 2
if [[ ! $name =~ ^[A-Za-z0-9._-]+$ ]]; then
  echo "certs.sh: NAME must be [A-Za-z0-9._-]+" >&2
  exit 2
fi
mkdir -p "$dir"
umask 077
days=${SHARDLINE_CERT_DAYS:-825}

if [[ ! -f $dir/ca.pem ]]; then
  openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
    -subj "/CN=Shardline development CA" -keyout "$dir/ca.key" -out "$dir/ca.pem" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
fi

sans="DNS:$name,DNS:localhost,IP:127.0.0.1"
for san in "$@"; do
  case $san in
    DNS:*|IP:*) sans+=",$san" ;;
    *[!0-9.]*) sans+=",DNS:$san" ;;
    *) sans+=",IP:$san" ;;
  esac
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$name" \
  -keyout "$work/key.pem" -out "$work/csr.pem" 2>/dev/null
cat >"$work/ext.cnf" <<EXT
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=$sans
EXT
openssl x509 -req -in "$work/csr.pem" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" -CAcreateserial \
  -days "$days" -extfile "$work/ext.cnf" -out "$work/cert.pem" 2>/dev/null
# Replaced whole, key first, so that a daemon re-reading them never pairs a
# new certificate with an old key for longer than one refresh.
mv "$work/key.pem" "$dir/$name.key"
mv "$work/cert.pem" "$dir/$name.pem"
echo "certs.sh: $dir/$name.pem ($sans), signed by $dir/ca.pem"

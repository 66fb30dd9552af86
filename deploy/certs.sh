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
# files; the old certificate kept as DIR/NAME.previous.pem, to revoke with
# --revoke NAME.previous); the daemons read them again within --tls_refresh_s. A new CA:
# put both CAs in the ca.pem every daemon reads, re-issue, then drop the old.
# For production, issue certificates from your own CA the same way (EC P-256,
# serverAuth and clientAuth: every daemon is both).
#
#   deploy/certs.sh DIR --revoke NAME   revokes DIR/NAME.pem, then as --crl
#   deploy/certs.sh DIR --crl           writes DIR/crl/: the CA's revocation
#                                       list (what was revoked so far, maybe
#                                       nothing), valid SHARDLINE_CRL_DAYS
#                                       (30), in OpenSSL's hashed form
# for every daemon's and shardctl's --tls_crl_dir=DIR/crl (a running daemon
# reads each new list at its next handshake). A daemon given it refuses a
# revoked certificate in the TLS handshake, and every certificate of a CA
# whose list is missing or past its next update: run --crl again before
# then (docs/operations.md, Revoking a certificate).
set -euo pipefail
if [[ $# -lt 2 ]]; then
  echo "usage: $0 DIR NAME [SAN ...] | DIR --revoke NAME | DIR --crl" >&2
  exit 2
fi
dir=$1
name=$2
shift 2

# The CA's database of revoked certificates (DIR/ca-index.txt) and the
# configuration `openssl ca` reads it with.
ca_database() {
  cat >"$dir/ca-crl.cnf" <<CNF
[ca]
default_ca = shardline
[shardline]
database = $dir/ca-index.txt
crlnumber = $dir/ca-crlnumber
default_md = sha256
default_crl_days = ${SHARDLINE_CRL_DAYS:-30}
certificate = $dir/ca.pem
private_key = $dir/ca.key
CNF
  [[ -f $dir/ca-index.txt ]] || : >"$dir/ca-index.txt"
  [[ -f $dir/ca-crlnumber ]] || echo 01 >"$dir/ca-crlnumber"
}

# The CA's revocation list from its database, into DIR/crl.
write_crl() {
  mkdir -p "$dir/crl"
  # A list wins over an earlier one by its later issue time, in seconds.
  while [[ -f $dir/ca-crl-time && $(date +%s) -le $(cat "$dir/ca-crl-time") ]]; do sleep 0.2; done
  date +%s >"$dir/ca-crl-time"
  local crl
  crl=$(mktemp "$dir/crl/new.XXXXXX")
  if ! out=$(openssl ca -config "$dir/ca-crl.cnf" -gencrl -out "$crl" 2>&1); then
    rm -f "$crl"
    echo "certs.sh: cannot write the revocation list: $out" >&2
    exit 1
  fi
  # OpenSSL's hashed form: HASH.r0, HASH.r1, … A running daemon has read
  # the files it found and reads only those with a higher suffix, so each
  # list is written as the next one; the earlier files get it too, so a
  # daemon starting now reads the newest whatever the suffix.
  local hash n=0
  hash=$(openssl crl -hash -noout -in "$crl")
  while [[ -e $dir/crl/$hash.r$n ]]; do n=$((n + 1)); done
  for ((k = 0; k <= n; k++)); do cp "$crl" "$dir/crl/$hash.r$k.tmp" && mv "$dir/crl/$hash.r$k.tmp" "$dir/crl/$hash.r$k"; done
  rm -f "$crl"
  echo "certs.sh: $dir/crl/$hash.r$n lists $(grep -c '^R' "$dir/ca-index.txt" || true) revoked certificates," \
    "next update in ${SHARDLINE_CRL_DAYS:-30} days"
}

if [[ $name == --revoke || $name == --crl ]]; then
  umask 077
  if [[ ! ${SHARDLINE_CRL_DAYS:-30} =~ ^[1-9][0-9]{0,3}$ ]]; then
    echo "certs.sh: SHARDLINE_CRL_DAYS must be a number of days within [1, 9999]" >&2
    exit 2
  fi
  if [[ ! -f $dir/ca.pem || ! -f $dir/ca.key ]]; then
    echo "certs.sh: $dir holds no CA (ca.pem, ca.key)" >&2
    exit 2
  fi
  ca_database
  if [[ $name == --revoke ]]; then
    if [[ $# -ne 1 || ! $1 =~ ^[A-Za-z0-9._-]+$ || ! -f $dir/$1.pem ]]; then
      echo "certs.sh: --revoke NAME needs $dir/NAME.pem" >&2
      exit 2
    fi
    if ! out=$(openssl ca -config "$dir/ca-crl.cnf" -revoke "$dir/$1.pem" 2>&1); then
      if [[ $out != *"Already revoked"* ]]; then
        echo "certs.sh: cannot revoke $dir/$1.pem: $out" >&2
        exit 1
      fi
      echo "certs.sh: $dir/$1.pem was revoked already"
    else
      echo "certs.sh: revoked $dir/$1.pem"
    fi
  fi
  write_crl
  exit 0
fi
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
if [[ -f $dir/$name.pem ]]; then cp "$dir/$name.pem" "$dir/$name.previous.pem"; fi
mv "$work/key.pem" "$dir/$name.key"
mv "$work/cert.pem" "$dir/$name.pem"
echo "certs.sh: $dir/$name.pem ($sans), signed by $dir/ca.pem"

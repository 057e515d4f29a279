#!/usr/bin/env bash
# Generates the test keys and certificates with the openssl command (Debian's OpenSSL 3.0):
# a test CA, accessories signed by it (RSA-1024 as coprocessor 2.0 has, P-256 as 3.0 has), an
# unrelated CA, and a certificate with an 8192-bit key (more than the 4096 bits taken). They are
# for tests and the simulator only, and checked in so that tests need no generation (the 8192-bit
# key takes a while). Run from anywhere: tools need only `openssl`.
set -euo pipefail
cd "$(dirname "$0")"
days=36500
subject() { echo "/C=US/O=AccessoryHost Tests/OU=$1/CN=$2"; }

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout test-ca.key -out test-ca.pem -days $days \
    -subj "$(subject "Test Accessories Certification Authority" "AccessoryHost Test CA")" \
    -addext basicConstraints=critical,CA:true -addext keyUsage=critical,keyCertSign,cRLSign
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout other-ca.key -out other-ca.pem -days $days \
    -subj "$(subject "Unrelated Certification Authority" "Unrelated CA")" \
    -addext basicConstraints=critical,CA:true -addext keyUsage=critical,keyCertSign,cRLSign

leaf() { # name, key options, common name
    openssl req -new -newkey "$2" ${3:+-pkeyopt "$3"} -nodes -keyout "$1.key" -out "$1.csr" -subj "$(subject "Test Accessories" "$4")"
    openssl x509 -req -in "$1.csr" -CA test-ca.pem -CAkey test-ca.key -set_serial "0x$(openssl rand -hex 8)" -days $days -sha256 \
        -extfile <(printf 'basicConstraints=critical,CA:false\nkeyUsage=critical,digitalSignature\n') -out "$1.pem"
    rm "$1.csr"
}
leaf accessory-rsa rsa:1024 "" "IPA_TEST_RSA_0001"
leaf accessory-p256 ec ec_paramgen_curve:P-256 "IPA_TEST_P256_0001"

# A self-signed certificate with an 8192-bit RSA key: a key no coprocessor has.
openssl req -x509 -newkey rsa:8192 -nodes -keyout huge-key.key -out huge-key.pem -days $days \
    -subj "$(subject "Hostile" "Huge Key")"
rm huge-key.key other-ca.key test-ca.key

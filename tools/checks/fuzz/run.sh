#!/usr/bin/env bash
# Builds the libFuzzer targets (swiftc -sanitize=fuzzer,address) and runs each for a bounded
# time, seeded with the shipped samples. Exits non-zero on any crash, memory error or failed
# invariant (leak detection is off: the Swift runtime's lazily built caches read as leaks);
# a crashing input is left in tools/checks/fuzz/out/<target>/ for reproduction:
#     tools/checks/fuzz/out/bin/<target> tools/checks/fuzz/out/<target>/crash-…
#
# Usage: tools/checks/fuzz/run.sh [seconds-per-target] [target…]    (default 60 s, all targets)
set -euo pipefail
cd "$(dirname "$0")/../../.."
seconds=${1:-60}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(scanner messages inspect link iap1 descriptors pcap certificate daemon ring)

out=tools/checks/fuzz/out
bin=$out/bin
mkdir -p "$bin"
flags=(-O -parse-as-library -sanitize=fuzzer,address -swift-version 6 -package-name AccessoryHost -I Sources/CSharedMemory)
# A crash is reported by libFuzzer and ASan; Swift's backtracer would only hold the run up.
export SWIFT_BACKTRACE=enable=no
# ld.gold warns about every ASan helper symbol; those lines carry no information.
quiet() { grep -v "Cannot export local symbol '__asan" || true; }

echo "fuzz: building ByteRing, IAPWire, IAPLink, SystemCalls, AccessoryLogging and IAPInspect with coverage instrumentation"
swiftc "${flags[@]}" -module-name ByteRing -emit-module -emit-module-path "$bin/ByteRing.swiftmodule" \
    -wmo -c -o "$bin/ByteRing.o" Sources/ByteRing/*.swift 2>&1 | quiet
swiftc "${flags[@]}" -module-name IAPWire -emit-module -emit-module-path "$bin/IAPWire.swiftmodule" \
    -wmo -c -o "$bin/IAPWire.o" Sources/IAPWire/*.swift 2>&1 | quiet
swiftc "${flags[@]}" -module-name IAPLink -I "$bin" -emit-module -emit-module-path "$bin/IAPLink.swiftmodule" \
    -wmo -c -o "$bin/IAPLink.o" Sources/IAPLink/*.swift 2>&1 | quiet
swiftc "${flags[@]}" -module-name SystemCalls -emit-module -emit-module-path "$bin/SystemCalls.swiftmodule" \
    -wmo -c -o "$bin/SystemCalls.o" Sources/SystemCalls/*.swift 2>&1 | quiet
swiftc "${flags[@]}" -module-name AccessoryLogging -I "$bin" -emit-module -emit-module-path "$bin/AccessoryLogging.swiftmodule" \
    -wmo -c -o "$bin/AccessoryLogging.o" Sources/AccessoryLogging/*.swift 2>&1 | quiet
swiftc "${flags[@]}" -module-name IAPInspect -I "$bin" -emit-module -emit-module-path "$bin/IAPInspect.swiftmodule" \
    -wmo -c -o "$bin/IAPInspect.o" Sources/IAPInspect/*.swift 2>&1 | quiet
# The certificate path links Debian's OpenSSL (libcrypto, through Sources/COpenSSL's module map);
# OpenSSL itself is not instrumented, our wrapper and everything above it are.
swiftc "${flags[@]}" -module-name IAPAuthentication -I "$bin" -I Sources/COpenSSL -emit-module -emit-module-path "$bin/IAPAuthentication.swiftmodule" \
    -wmo -c -o "$bin/IAPAuthentication.o" Sources/IAPAuthentication/*.swift 2>&1 | quiet

# The transports' module, for the session rings' channel (SharedRingChannel).
swiftc "${flags[@]}" -enable-upcoming-feature InternalImportsByDefault -enable-upcoming-feature ExistentialAny -module-name IAPTransport -I "$bin" -emit-module -emit-module-path "$bin/IAPTransport.swiftmodule" \
    -wmo -c -o "$bin/IAPTransport.o" Sources/IAPTransport/*.swift 2>&1 | quiet

# iapd's client protocol (the framer and the messages).
swiftc "${flags[@]}" -module-name IAPDaemonProtocol -I "$bin" -emit-module -emit-module-path "$bin/IAPDaemonProtocol.swiftmodule" \
    -wmo -c -o "$bin/IAPDaemonProtocol.o" Sources/IAPDaemonProtocol/*.swift 2>&1 | quiet

declare -A source=([scanner]=ScannerFuzz.swift [messages]=MessageFuzz.swift [inspect]=InspectFuzz.swift [link]="LinkFuzz.swift FuzzSteps.swift" [iap1]="IAP1Fuzz.swift FuzzSteps.swift"
                   [descriptors]="DescriptorFuzz.swift ../../../Sources/USBDescriptors/Descriptors.swift ../../../Sources/AccessoryHost/USBID.swift" [pcap]=PcapFuzz.swift [certificate]=CertificateFuzz.swift [daemon]=DaemonFuzz.swift
                   [ring]=RingFuzz.swift)
status=0
for target in "${targets[@]}"; do
    file=${source[$target]:-}
    [ -n "$file" ] || { echo "fuzz: unknown target '$target' (scanner, messages, inspect, link, iap1, descriptors, pcap, certificate, daemon, ring)" >&2; exit 64; }
    files=()
    for f in $file; do files+=("tools/checks/fuzz/$f"); done
    extra=()
    [ "$target" = certificate ] && extra=(-I Sources/COpenSSL "$bin/IAPAuthentication.o" -lcrypto)
    [ "$target" = daemon ] && extra=("$bin/IAPDaemonProtocol.o")
    [ "$target" = ring ] && extra=("$bin/IAPTransport.o")
    swiftc "${flags[@]}" -I "$bin" "${files[@]}" "$bin/ByteRing.o" "$bin/IAPWire.o" "$bin/IAPLink.o" "$bin/SystemCalls.o" "$bin/AccessoryLogging.o" "$bin/IAPInspect.o" \
        "${extra[@]}" -o "$bin/$target" 2>&1 | quiet
    [ -x "$bin/$target" ] || { echo "fuzz: building $target failed" >&2; exit 1; }
    corpus=$out/$target/corpus
    rm -f "$out/$target"/crash-* "$out/$target"/leak-* "$out/$target"/timeout-* "$out/$target"/oom-*
    mkdir -p "$corpus"
    # Seeds: every shipped sample as raw bytes, and a few hand-picked frames.
    for sample in tools/data/samples/*.hex; do
        grep -v '^#' "$sample" | sed 's/#.*//' | tr -d ' \n' | xxd -r -p > "$corpus/seed-$(basename "$sample" .hex)" 2>/dev/null || true
    done
    printf '\x40\x40\x00\x11\xEA\x00\x00\x05\x00\x00\xB1\x00\x06\x00\x01\x00\x01' > "$corpus/seed-ea00"
    # The DJI Goggles 3 MFi configuration (PROTOCOL.md §4.2), for the descriptor parser.
    printf '\x09\x02\x40\x00\x02\x01\x04\x80\x01\x09\x04\x00\x00\x02\xff\xf0\x00\x05\x07\x05\x81\x02\x00\x02\x00\x07\x05\x01\x02\x00\x02\x00\x09\x04\x01\x00\x00\xff\xf0\x01\x06\x09\x04\x01\x01\x02\xff\xf0\x01\x06\x07\x05\x82\x02\x00\x02\x00\x07\x05\x02\x02\x00\x02\x00\x01' > "$corpus/seed-dji-config"
    # Captures for the pcap reader: an iapctl trace and a usbmon capture (tools/clients/wireshark/captures.py).
    if [ "$target" = pcap ] && command -v python3 >/dev/null; then
        python3 tools/clients/wireshark/captures.py "$corpus" && mv "$corpus/malformed.pcapng" "$corpus/seed-trace.pcapng" \
            && mv "$corpus/usbmon.pcap" "$corpus/seed-usbmon.pcap" || true
    fi
    if [ "$target" = daemon ]; then
        # A session of requests as the library sends them, and the replies it reads.
        printf '\x00\x00\x00\x2d{"id":1,"request":{"hello":{"client":"x","version":1}}}' > "$corpus/seed-hello"
        printf '\x00\x00\x00\x46{"id":2,"request":{"open":{"accessory":1,"protocolString":"com.example.echo"}}}' > "$corpus/seed-open"
        printf '\x00\x00\x00\x21{"id":3,"request":{"list":{}}}' > "$corpus/seed-list"
        printf '\x00\x00\x00\x3f{"id":2,"reply":{"opened":{"accessory":1,"protocolString":"a","session":1}}}' > "$corpus/seed-opened"
    fi
    if [ "$target" = certificate ]; then
        # The test fixtures as X.509 and as PKCS#7 DER, and the real accessory's certificate.
        for pem in Tests/IAPAuthenticationTests/Fixtures/*.pem; do
            openssl x509 -in "$pem" -outform DER -out "$corpus/seed-$(basename "$pem" .pem).der" 2>/dev/null || true
            openssl crl2pkcs7 -nocrl -certfile "$pem" -outform DER -out "$corpus/seed-$(basename "$pem" .pem).p7" 2>/dev/null || true
        done
        python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); sys.stdout.buffer.write(bytes.fromhex(d["certificate_pkcs7_der_hex"]))' \
            tools/data/samples/pioneer-auth.json > "$corpus/seed-pioneer.p7"
        export CERTIFICATE_FUZZ_TRUST="$PWD/Tests/IAPAuthenticationTests/Fixtures/test-ca.pem"
    fi
    echo "fuzz: running $target for ${seconds}s"
    if ! (cd "$out/$target" && ASAN_OPTIONS=detect_leaks=0 "../bin/$target" -max_total_time="$seconds" -max_len=4096 -timeout=10 -rss_limit_mb=2048 -detect_leaks=0 \
            -print_final_stats=1 corpus 2>&1 | tail -n 12); then
        echo "fuzz: $target FAILED; crashing input kept in $out/$target/" >&2
        status=1
    fi
done
exit $status

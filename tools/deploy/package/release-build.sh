#!/usr/bin/env bash
# The shipping release build: each executable product of the package with the Swift runtime and
# Foundation linked in statically (`--static-swift-stdlib`), so that it runs on a machine without
# the Swift toolchain and `ldd` lists only Debian's libraries (libc, libusb, libssl/libcrypto,
# libdbus). tools/test.sh, tools/install.sh and tools/deploy/package/deb.sh build with it, into
# .build/release as `swift build -c release` does.
#
# Usage: tools/deploy/package/release-build.sh [PRODUCT…]   (default: every executable product)
# Exit status: 0 built without warnings, 1 the build failed or warned (its log on stderr).
#
# One `swift build --product` per executable: a whole-package build would also compile the test
# helper targets (Tests/TestThreads imports Testing), which the toolchain has no static form of.
# The products share every library module, so the second and later ones only compile their own
# module and link.
set -euo pipefail
cd "$(dirname "$0")/../../.."
products=("$@")
[ ${#products[@]} -gt 0 ] || products=(iapctl iapd iapbench ea-echo serial-echo)
log=$(mktemp)
trap 'rm -f "$log" "$log.warnings"' EXIT
# Hardened as Debian builds its packages: relocations read-only and bound at start (-z relro,
# -z now).
flags=(-c release --static-swift-stdlib -Xlinker -z -Xlinker relro -Xlinker -z -Xlinker now)
for product in "${products[@]}"; do
    if ! swift build "${flags[@]}" --product "$product" > "$log" 2>&1; then
        cat "$log" >&2
        echo "release-build: swift build ${flags[*]} --product $product failed (above)" >&2
        exit 1
    fi
    # The one warning allowed is the linker's note on the toolchain's own static Foundation
    # (FoundationEssentials calls mktemp(3) for a unique name, not to open the file); every
    # other warning fails the build as in the debug build.
    grep "warning:" "$log" | grep -v "libFoundationEssentials.a(.*the use of \`mktemp' is dangerous" > "$log.warnings" || true
    if [ -s "$log.warnings" ]; then
        cat "$log.warnings" >&2
        rm -f "$log.warnings"
        echo "release-build: $product built with warnings (above)" >&2
        exit 1
    fi
    grep -q "complete" "$log" || { cat "$log" >&2; echo "release-build: $product did not build" >&2; exit 1; }
    echo "release-build: $product ($(du -h ".build/release/$product" | cut -f1), Swift runtime linked statically)"
done

#!/bin/sh
# Check rmqstore/_crc32.h against zlib crc32 and benchmark it.
# Usage: bench/crc32_check.sh   (from anywhere; needs gcc and zlib headers)
set -e
cd "$(dirname "$0")/.."
out=$(mktemp)
trap 'rm -f "$out"' EXIT
gcc -O2 -Wall -Wextra -o "$out" bench/crc32_check.c -lz
"$out"

#!/bin/sh
# kit: which NCCL the engine was compiled and linked against, from the build itself: the nccl.h and libnccl that
# CMake found (CMakeCache.txt NCCL_INCLUDE_DIR / NCCL_LIBRARY, llama.cpp's cmake/FindNCCL.cmake), the header's
# NCCL_VERSION_CODE and the library's ncclGetVersion. Fails the build when either is not the pin, and writes both
# for `kit verify` (nccl-builder).
# usage: nccl-linked.sh CMAKE_CACHE PIN OUT
set -eu
cache=$1
pin=$2
out=$3
inc=$(sed -n 's/^NCCL_INCLUDE_DIR:[A-Z]*=//p' "$cache")
lib=$(sed -n 's/^NCCL_LIBRARY:[A-Z]*=//p' "$cache")
if [ -z "$inc" ] || [ ! -f "$inc/nccl.h" ] || [ -z "$lib" ] || [ ! -e "$lib" ]; then
    echo "kit: the build found no NCCL (NCCL_INCLUDE_DIR='$inc' NCCL_LIBRARY='$lib' in $cache) but nccl.version pins $pin" >&2
    exit 1
fi
code=$(sed -n 's/^#define NCCL_VERSION_CODE \([0-9][0-9]*\).*/\1/p' "$inc/nccl.h")
if [ -z "$code" ]; then
    echo "kit: $inc/nccl.h has no NCCL_VERSION_CODE" >&2
    exit 1
fi
# nccl.h: below 2.9 the code is major*1000 + minor*100 + patch, from 2.9 on major*10000 + minor*100 + patch
if [ "$code" -ge 10000 ]; then major=$((code / 10000)); rest=$((code % 10000)); else major=$((code / 1000)); rest=$((code % 1000)); fi
header=$major.$((rest / 100)).$((rest % 100))
library=$(kit-nccl-version "$lib")
if [ "$header" != "$pin" ] || [ "$library" != "$pin" ]; then
    echo "kit: the engine compiled against nccl.h $header ($inc/nccl.h) and linked $library ($lib), but nccl.version pins $pin" >&2
    exit 1
fi
printf 'header %s %s\nlibrary %s %s\n' "$header" "$inc/nccl.h" "$library" "$lib" > "$out"
echo "kit: the engine compiled against nccl.h $header and linked libnccl $library = nccl.version $pin"

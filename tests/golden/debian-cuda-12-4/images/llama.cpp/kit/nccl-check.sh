#!/bin/sh
# kit NCCL check: fail the build when the NCCL the loader resolves is not the pinned one.
# usage: nccl-check.sh STAGE PIN [BUILDER_SEEN_FILE]
set -eu
stage=$1
pin=$2
builder_file=${3:-}
if ! seen=$(kit-nccl-version); then
    echo "kit: NCCL check failed in the $stage stage: libnccl.so.2 cannot be loaded (nccl.version pins $pin)" >&2
    exit 1
fi
if [ "$seen" != "$pin" ]; then
    echo "kit: NCCL mismatch in the $stage stage: the loader resolves NCCL $seen but nccl.version pins $pin" >&2
    exit 1
fi
if [ -n "$builder_file" ]; then
    built=$(cat "$builder_file")
    if [ "$built" != "$seen" ]; then
        echo "kit: NCCL mismatch: the $stage stage loads NCCL $seen but the builder compiled against NCCL $built" >&2
        exit 1
    fi
fi
echo "kit: NCCL $seen in the $stage stage matches nccl.version $pin"

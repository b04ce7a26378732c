#!/usr/bin/env bash
# troupe's choice of OpenBLAS kernel family (kernels/blas_core.hpp), end to end:
# - OPENBLAS_CORETYPE unset: troupe runs the portable family (Haswell) and
#   saves the same bytes as a run forced to it with OPENBLAS_CORETYPE;
# - topology.host_kernels = "native": this CPU's fastest family, the same bytes
#   as a run forced to that family;
# - the run log, metrics.jsonl and validate name the family; a user's
#   OPENBLAS_CORETYPE is kept, with a warning when it is not the portable one;
# - the bytes do not depend on the threads per device (1, 2, 3), at a model
#   size (the default's d_model 128) whose GEMMs are split over the threads.
# usage: kernel_family_test.sh TROUPE_BINARY
set -uo pipefail
troupe=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
source "$(dirname "$0")/../cli_test_lib.sh"  # failures, fail, expect_exit, expect_output, finish
unset OPENBLAS_CORETYPE TROUPE_OPENBLAS_CORETYPE

# shellcheck disable=SC2046  # the flags are words
missing=$(cpu_lacks $(family_flags Haswell))
[ -z "$missing" ] || { echo "skipped: this CPU lacks $missing, so the portable family cannot run"; exit 77; }
native=Haswell
# shellcheck disable=SC2046
[ -z "$(cpu_lacks $(family_flags SkylakeX))" ] && native=SkylakeX

run=(--set log.progress=plain --set run.mode='"pretrain"' --set data.target_pairs='""' --set run.eval_batches=1
     --set data.eval_problems=20 --set model.tie_embeddings=false --set optim.warmup_steps=20 --set run.steps=2
     --set topology.devices=2 --set topology.stages=2 --set 'topology.schedule="1f1b"' --set topology.microbatches=2
     --set topology.expert_shards=2 --set topology.threads_per_device=2)
same() {  # DIR_A DIR_B WHAT
  for f in params.f32.zst adam_m.f32.zst adam_v.f32.zst; do
    cmp -s "$work/$1/checkpoint/$f" "$work/$2/checkpoint/$f" || fail "$3: $f differs"
  done
}

expect_exit 0 "$troupe" validate "${run[@]}"
expect_output "host kernels: OpenBLAS Haswell (portable: the same bits on every x86-64 CPU with AVX2 and FMA)"
expect_exit 0 "$troupe" run "${run[@]}" --set run.out_dir="$work/auto"
expect_output "OpenBLAS kernels Haswell (portable"
grep -q '"openblas_core":"Haswell","host_kernels":"portable"' "$work/auto/metrics.jsonl" || fail "start line does not name the portable family"
expect_exit 0 env OPENBLAS_CORETYPE=Haswell "$troupe" run "${run[@]}" --set run.out_dir="$work/forced"
expect_output "OpenBLAS kernels Haswell (set by OPENBLAS_CORETYPE in the environment)"
same auto forced "the default run against OPENBLAS_CORETYPE=Haswell"

# Threads per device change nothing.
for t in 1 3; do
  expect_exit 0 "$troupe" run "${run[@]}" --set topology.threads_per_device=$t --set run.out_dir="$work/t$t"
  same auto "t$t" "threads_per_device = $t against 2"
done

# native: this CPU's fastest family, and the bytes of a run forced to it.
expect_exit 0 "$troupe" validate "${run[@]}" --set topology.host_kernels='"native"'
expect_output "host kernels: OpenBLAS $native (native"
expect_exit 0 "$troupe" run "${run[@]}" --set topology.host_kernels='"native"' --set run.out_dir="$work/native"
grep -q "\"openblas_core\":\"$native\",\"host_kernels\":\"native\"" "$work/native/metrics.jsonl" || fail "native run: start line does not name $native"
expect_exit 0 env OPENBLAS_CORETYPE=$native "$troupe" run "${run[@]}" --set run.out_dir="$work/native_forced"
same native native_forced "host_kernels = \"native\" against OPENBLAS_CORETYPE=$native"

# A user's family is kept; a non-portable one under host_kernels = "portable" is a warning.
expect_exit 0 env OPENBLAS_CORETYPE=Prescott "$troupe" run "${run[@]}" --set run.steps=1 --set run.out_dir="$work/user"
expect_output "but OpenBLAS runs Prescott (set by OPENBLAS_CORETYPE in the environment; not the portable family (Haswell)"
grep -q '"openblas_core":"Prescott"' "$work/user/metrics.jsonl" || fail "a user's OPENBLAS_CORETYPE was not kept"
expect_exit 3 "$troupe" validate "${run[@]}" --set topology.host_kernels='"fast"'
expect_output 'host_kernels = "fast" is not one of "portable", "native"'

finish "kernel family checks"

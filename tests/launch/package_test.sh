#!/usr/bin/env bash
# troupe as a package: `cmake --install` the build tree into a temporary
# prefix, then configure and build tests/launch/package_consumer/ against it with
# find_package(troupe), run it, and run the installed `troupe` binary.
# usage: package_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" > "$work/install.log"
for f in bin/troupe lib/libtroupe_model.a lib/libtroupe_rl.a lib/libtroupe_moe.a lib/libtroupe_kernels.a \
         include/troupe/model/params.hpp include/troupe/kernels/tensor.hpp lib/cmake/troupe/troupeConfig.cmake; do
  [ -e "$work/prefix/$f" ] || { echo "FAIL: the install lacks $f"; exit 1; }
done
"$work/prefix/bin/troupe" --version | grep -q '^troupe ' || { echo "FAIL: the installed troupe does not run"; exit 1; }
export CCACHE_DISABLE=1
cmake -S "$src/tests/launch/package_consumer" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_BUILD_TYPE=Release > "$work/configure.log" || { cat "$work/configure.log"; echo "FAIL: configure"; exit 1; }
cmake --build "$work/consumer" > "$work/build.log" 2>&1 || { cat "$work/build.log"; echo "FAIL: build"; exit 1; }
out=$("$work/consumer/consumer")
echo "$out"
# The quickstart decoder: the same count `troupe validate` prints for the default model.
want=$("$work/prefix/bin/troupe" validate --set model.tie_embeddings=true --set topology.devices=1 --set topology.stages=1 \
  --set 'topology.schedule="sequential"' --set topology.microbatches=1 --set topology.expert_shards=1 \
  --set topology.optimizer_shards=1 | grep -o '[0-9]* parameters' | head -1 | cut -d' ' -f1)
grep -q "^parameters $want in " <<<"$out" || { echo "FAIL: expected $want parameters"; exit 1; }
grep -q "^advantages 0.50 -0.50 -0.50 0.50 reward_mean 0.50" <<<"$out" || { echo "FAIL: advantages"; exit 1; }
echo "package_test: the installed package builds and runs a downstream project"

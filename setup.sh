#!/usr/bin/env bash
# One-command set-up for troupe on Debian 12: installs the Debian packages that
# are missing (no apt-get update when nothing is), configures and builds, then
#   ./setup.sh run [SPEC] [troupe options]   trains (the built-in default spec without SPEC)
#   ./setup.sh test [ctest options]          runs the whole test suite
#   ./setup.sh build                         only installs and builds
# Environment: BUILD_DIR (default build), JOBS (default: number of cores).
set -euo pipefail
cd "$(dirname "$0")"

PACKAGES=(
  cmake g++ make pkg-config
  libcaf-dev                                  # actors (CAF 0.17; its OpenSSL module for TLS between processes)
  libssl-dev                                  # the cluster key and certificate ([topology] auth = "tls")
  capnproto libcapnp-dev                      # messages
  libopenmpi-dev openmpi-bin                  # processes
  ocl-icd-opencl-dev opencl-headers libclblast-dev pocl-opencl-icd clinfo  # OpenCL (+ a CPU device)
  libopenblas-dev                             # host GEMM
  libzstd-dev libspdlog-dev libtomlplusplus-dev
  zlib1g-dev                                  # CRC-32 of each Envelope frame (damaged messages are a loss)
  libgtest-dev libbenchmark-dev
  libcpp-httplib-dev nlohmann-json3-dev       # `troupe dashboard`: HTTP server (loopback only), reading metrics.jsonl
  libjs-dygraphs libjs-d3                     # dashboard/report charts, served from /usr/share/javascript
  gnuplot-nox                                 # `troupe plot` images (PNG/SVG)
  libsentencepiece-dev                        # [tokenizer] kind = "sentencepiece", `troupe tokenizer train`
)
# Only for `./setup.sh test`: the dashboard's browser test drives headless Chromium;
# the two-host test makes network namespaces with iproute2's `ip`; the own-task
# test reads an exported tokenizer.model back with SentencePiece's Python module.
TEST_PACKAGES=(chromium iproute2 python3-sentencepiece)

install_missing() {
  local missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    echo "setup: all ${#PACKAGES[@]} Debian packages are installed"
    return
  fi
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  echo "setup: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
}

# Which kernel families the bitwise matrix covered (tests/bitwise_matrix.sh
# leaves one line per cell: family, threads, test, outcome).
bitwise_summary() {
  local dir=$1 family
  [ -d "$dir" ] || return 0
  echo "bitwise matrix: tests that compare bits, run under each OpenBLAS kernel family:"
  for family in Prescott Haswell SkylakeX Cooperlake; do
    cat "$dir"/*."$family".t* 2>/dev/null | awk -F'\t' -v fam="$family" '
      { n++; if ($4 == "passed") p++; else if ($4 ~ /^skipped/) { s++; why = substr($4, 9) } else f++
        if ($2 != "0") t[$2] = 1 }
      END {
        if (!n) exit
        th = ""; for (k = 1; k <= 1024; k++) if (k in t) th = th (th == "" ? "" : ",") k
        printf "  %-9s %d passed, %d failed, %d skipped%s%s\n", fam, p, f, s,
               (s ? " " why : ""), (th != "" ? "; threads per device " th : "")
      }'
  done
}

BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}

build() {
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release
  cmake --build "$BUILD_DIR" -j "$JOBS"
}

cmd=${1:-build}
[ $# -gt 0 ] && shift
case "$cmd" in
  build)
    install_missing; build ;;
  run)
    install_missing; build
    exec "./$BUILD_DIR/troupe" run "$@" ;;
  test)
    PACKAGES+=("${TEST_PACKAGES[@]}")
    install_missing; build
    # OpenCL cases must run (PoCL is installed above), not skip.
    export TROUPE_REQUIRE_OPENCL=1
    cd "$BUILD_DIR"
    rm -rf Testing/bitwise  # the bitwise matrix's cells write their outcome here
    rc=0
    # The family every test that does not pick its own runs under: troupe's
    # choice (the portable one), or OPENBLAS_CORETYPE when it is set.
    family="OpenBLAS kernels $(./troupe --version | sed -n 's/^OpenBLAS kernels: //p')"
    echo "test suite: $family"
    ctest --output-on-failure -j "$JOBS" "$@" || rc=$?
    echo "test suite ran under $family"
    bitwise_summary Testing/bitwise
    exit $rc ;;
  -h|--help|help)
    sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//' ;;
  *)
    echo "setup.sh: unknown command '$cmd' (expected build, run or test)" >&2; exit 2 ;;
esac

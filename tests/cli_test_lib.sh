# Helpers for the end-to-end CLI test scripts (sourced): a failure counter,
# expect_exit CODE CMD... (runs CMD, keeps its output in $out, checks the exit
# code), expect_output TEXT (TEXT is in $out) and finish (the summary and the
# script's exit code).
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
expect_exit() {
  local want=$1; shift
  out=$("$@" 2>&1); local got=$?
  [ "$got" -eq "$want" ] || fail "'$*' exited $got, expected $want; output:\n$out"
}
expect_output() {
  grep -qF -- "$1" <<<"$out" || fail "expected '$1' in output of the last command; got:\n$out"
}
finish() {
  if [ "$failures" -ne 0 ]; then
    echo "$failures failure(s)"
    exit 1
  fi
  echo "$1: all passed"
}

# The tiny MoE model and 1-digit addition data of the RL test scripts
# (tiny_model_toml FILE [EXTRA_TOML_LINES]); [log] is left to the caller.
tiny_model_toml() {
  cat > "$1" <<'TOML'
[model]
d_model = 32
n_layers = 2
n_heads = 2
seq_len = 32
n_experts = 4
expert_hidden = 32
tie_embeddings = false
[data]
source = "addition"
digits = 1
batch_size = 4
eval_problems = 20
TOML
  [ -n "${2:-}" ] && printf '%s\n' "$2" >> "$1"
  return 0
}

# The CPU flags an OpenBLAS kernel family needs (family_flags FAMILY; fails on
# an unknown family), and the first of FLAGS... this CPU lacks (cpu_lacks
# FLAGS...; prints nothing when it has them all).
family_flags() {
  case $1 in
    Prescott) echo pni ;;  # SSE3
    Haswell) echo avx2 fma ;;
    SkylakeX) echo avx512f avx512bw avx512dq avx512vl avx512cd ;;
    Cooperlake) echo avx512f avx512bw avx512dq avx512vl avx512cd avx512_bf16 ;;
    *) return 1 ;;
  esac
}
cpu_lacks() {
  local flags f
  flags=$(grep -m1 '^flags' /proc/cpuinfo)
  for f in "$@"; do
    grep -qw "$f" <<<"$flags" || { echo "$f"; return 0; }
  done
}

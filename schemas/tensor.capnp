# Tensors on the wire: one dense, row-major array of a single element type.
# Every tensor that crosses an actor boundary (activations, gradients, expert
# rows, parameter slices) is one of these. Receivers check that the element
# count of `shape` times the element size equals the length of `data`
# (actors/transport/envelope.cpp does this for every Tensor in every message kind).
@0xe3ffc540ea2dfede;

$import "/capnp/c++.capnp".namespace("troupe::schemas");

# Element type. Append-only: new types get new ordinals, old ones never change
# meaning. f32 and i32 keep the ordinals of kernels::DType.
enum DType {
  f32 @0;   # IEEE-754 binary32, 4 bytes
  i32 @1;   # two's-complement 32-bit integer, 4 bytes (token ids, indices)
  bf16 @2;  # bfloat16, 2 bytes (reserved for compressed activations)
  f16 @3;   # IEEE-754 binary16, 2 bytes
  i64 @4;   # two's-complement 64-bit integer, 8 bytes
  u8 @5;    # unsigned byte, 1 byte (masks, quantized blobs)
  f64 @6;   # IEEE-754 binary64, 8 bytes (per-token inputs of a custom loss head)
}

struct Tensor {
  dtype @0 :DType;         # element type of `data`
  shape @1 :List(Int64);   # dimensions, outermost first; empty list = scalar (1 element); no negative entries
  data @2 :Data;           # elements, little endian, row-major; exactly product(shape) * size(dtype) bytes
}

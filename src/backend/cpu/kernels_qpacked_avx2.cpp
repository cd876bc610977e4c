// Quantized matmul over PackedAffine weights with AVX2 (vpmaddubsw +
// vpmaddwd). Compiled with -mavx2 -mfma -mf16c; the kernels are in
// kernels_qpacked_avx2.inc (see there and kernels_quant.h).
#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/kernels_quant.h"

namespace tandem::cpu::detail {

#include "backend/cpu/kernels_qpacked_avx2.inc"

const QuantKernels kAvx2PackedQuant = {"avx2-packed", act_bytes, prepare, compute};

}  // namespace tandem::cpu::detail

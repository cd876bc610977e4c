// Quantized matmul over PackedAffine weights with AVX-VNNI (256-bit
// vpdpbusd, VEX-encoded: Alder Lake, Zen 5 and later). Compiled with -mavx2
// -mfma -mf16c -mavxvnni; the kernels are in kernels_qpacked_avx2.inc.
#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/kernels_quant.h"

#define TANDEM_QUANT_VNNI 1

namespace tandem::cpu::detail {

#include "backend/cpu/kernels_qpacked_avx2.inc"

const QuantKernels kAvxVnniPackedQuant = {"avx2-vnni-packed", act_bytes, prepare, compute};

}  // namespace tandem::cpu::detail

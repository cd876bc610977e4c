// Buffers of weights converted at load (dequantized, quantized, packed).
//
// Large ones are anonymous mappings with transparent huge pages asked for
// (madvise; the kernel's default "madvise" mode grants them): filling 2 GB
// takes ~1,000 page faults instead of ~500,000, and the kernels that stream
// the weights miss the TLB far less. Small ones come from new[].
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace tandem {

struct OwnedBufferDeleter {
  size_t mapped_bytes = 0;  // 0: new[]
  void operator()(uint8_t* p) const;
};
using OwnedBuffer = std::unique_ptr<uint8_t[], OwnedBufferDeleter>;
using OwnedBuffers = std::vector<OwnedBuffer>;

// `bytes` of zeroed memory; mapped ones start on a 2 MiB boundary.
OwnedBuffer allocate_owned(size_t bytes);

}  // namespace tandem

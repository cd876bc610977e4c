#include "core/owned_buffer.h"

#include <sys/mman.h>

#include "core/error.h"

namespace tandem {

namespace {
constexpr size_t kHugePage = size_t(2) << 20;
}  // namespace

void OwnedBufferDeleter::operator()(uint8_t* p) const {
  if (!p) return;
  if (mapped_bytes)
    munmap(p, mapped_bytes);
  else
    delete[] p;
}

OwnedBuffer allocate_owned(size_t bytes) {
  if (bytes < kHugePage) return OwnedBuffer(new uint8_t[bytes ? bytes : 1](), OwnedBufferDeleter{});
  // Rounded up to whole huge pages, so the range can be backed by them.
  const size_t mapped = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  void* p =
      mmap(nullptr, mapped + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    fail(
        "out of memory: %.2f GB for weights converted at load (packed for the CPU, quantized or "
        "dequantized); TANDEM_CPU_REPACK=0 keeps BF16 weights mapped from the checkpoint instead",
        double(bytes) / 1e9);
  // Trim to a 2 MiB-aligned start (the kernel aligns only to 4 KiB).
  auto* base = static_cast<uint8_t*>(p);
  const size_t lead = (kHugePage - reinterpret_cast<uintptr_t>(base) % kHugePage) % kHugePage;
  if (lead) munmap(base, lead);
  if (kHugePage - lead) munmap(base + lead + mapped, kHugePage - lead);
  base += lead;
  madvise(base, mapped, MADV_HUGEPAGE);
  return OwnedBuffer(base, OwnedBufferDeleter{mapped});
}

}  // namespace tandem

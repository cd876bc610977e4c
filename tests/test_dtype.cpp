#include <gtest/gtest.h>

#include <cmath>

#include "core/dtype.h"

using namespace tandem;

TEST(DType, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 lies exactly between two bf16 values: ties go to the even one.
  EXPECT_EQ(f32_to_bf16(1.00390625f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.01171875f), 0x3f82);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(std::sqrt(80.0f))), 8.9375f);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
}

TEST(DType, F16RoundTripsEveryFiniteValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00) continue;  // inf / NaN
    EXPECT_EQ(f32_to_f16(f16_to_f32(uint16_t(h))), h) << h;
  }
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);               // rounds up to inf
}

TEST(DType, ParsesSafetensorsNames) {
  DType t;
  ASSERT_TRUE(parse_dtype("BF16", &t));
  EXPECT_EQ(t, DType::BF16);
  EXPECT_FALSE(parse_dtype("bf16", &t));
  EXPECT_EQ(dtype_size(DType::F16), 2u);
}

#include <gtest/gtest.h>

#include <vector>

#include "gradcomp/error.h"
#include "gradcomp/tensor.h"

namespace gradcomp {
namespace {

TEST(TensorView, DescribesItself) {
  std::vector<float> values(10);
  const auto view = TensorView::of(std::span<float>(values));
  EXPECT_EQ(view.numel(), 10u);
  EXPECT_EQ(view.bytes(), 40u);
  EXPECT_EQ(view.describe(), "f32[10] on cpu");
  EXPECT_EQ(view.data_as<float>(), values.data());
}

TEST(TensorView, RejectsNullDataWithElements) {
  EXPECT_THROW(TensorView(nullptr, 5, DType::kF32), InvalidArgument);
  EXPECT_NO_THROW(TensorView(nullptr, 0, DType::kF32));
}

TEST(TensorView, RejectsStreamOnCpu) {
  float x = 0;
  int fake_stream = 0;
  EXPECT_THROW(TensorView(&x, 1, DType::kF32, Device::cpu(), &fake_stream), InvalidArgument);
  EXPECT_NO_THROW(TensorView(&x, 1, DType::kF32, Device::cuda(0), &fake_stream));
}

TEST(TensorView, TypedAccessChecksDtype) {
  std::vector<std::int32_t> values(3);
  TensorView view(values.data(), values.size(), DType::kI32);
  EXPECT_NO_THROW(view.data_as<std::int32_t>());
  EXPECT_THROW(view.data_as<float>(), InvalidArgument);
  try {
    view.data_as<float>();
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("i32"), std::string::npos);
  }
}

TEST(TensorView, SliceChecksBounds) {
  std::vector<float> values(10);
  const auto view = TensorView::of(std::span<float>(values));
  const auto part = view.slice(3, 4);
  EXPECT_EQ(part.numel(), 4u);
  EXPECT_EQ(part.data_as<float>(), values.data() + 3);
  EXPECT_EQ(view.slice(10, 0).numel(), 0u);
  EXPECT_THROW(view.slice(8, 3), InvalidArgument);
  EXPECT_THROW(view.slice(11, 0), InvalidArgument);
}

TEST(TensorView, ExpectNamesTheTensor) {
  std::vector<float> values(4);
  const auto view = TensorView::of(std::span<float>(values));
  EXPECT_NO_THROW(view.expect(DType::kF32, 4, "grad"));
  try {
    view.expect(DType::kF32, 5, "layer1.weight");
    FAIL() << "expected a throw";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("layer1.weight"), std::string::npos);
  }
}

TEST(DType, SizesNamesAndParsing) {
  EXPECT_EQ(dtype_size(DType::kF32), 4u);
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
  EXPECT_EQ(dtype_size(DType::kU8), 1u);
  EXPECT_EQ(parse_dtype("bfloat16"), DType::kBF16);
  EXPECT_EQ(parse_dtype(dtype_name(DType::kF16)), DType::kF16);
  EXPECT_THROW(parse_dtype("f64"), InvalidArgument);
  EXPECT_EQ(device_name(Device::cuda(3)), "cuda:3");
}

}  // namespace
}  // namespace gradcomp

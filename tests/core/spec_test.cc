#include <gtest/gtest.h>

#include "gradcomp/error.h"
#include "gradcomp/registry.h"

namespace gradcomp {
namespace {

TEST(ParseSpec, NameOnly) {
  const auto spec = parse_spec("topk");
  EXPECT_EQ(spec.name, "topk");
  EXPECT_TRUE(spec.params.empty());
}

TEST(ParseSpec, KeyValuePairsInOrderWithWhitespace) {
  const auto spec = parse_spec(" topk : ratio = 0.01 , ef=on ");
  EXPECT_EQ(spec.name, "topk");
  ASSERT_EQ(spec.params.size(), 2u);
  EXPECT_EQ(spec.params[0], (std::pair<std::string, std::string>{"ratio", "0.01"}));
  EXPECT_EQ(spec.params[1], (std::pair<std::string, std::string>{"ef", "on"}));
}

TEST(ParseSpec, SyntaxErrorsAreInvalidArgument) {
  EXPECT_THROW(parse_spec(""), InvalidArgument);
  EXPECT_THROW(parse_spec("TopK"), InvalidArgument);
  EXPECT_THROW(parse_spec("topk:"), InvalidArgument);
  EXPECT_THROW(parse_spec("topk:ratio"), InvalidArgument);
  EXPECT_THROW(parse_spec("topk:ratio="), InvalidArgument);
  EXPECT_THROW(parse_spec("topk:ratio=0.1,ratio=0.2"), InvalidArgument);
  EXPECT_THROW(parse_spec("topk:ratio=0.1,,ef=on"), InvalidArgument);
  EXPECT_THROW(parse_spec("topk:a=b=c"), InvalidArgument);
}

class SpecValidation : public ::testing::Test {
 protected:
  void SetUp() override {
    CompressorInfo info;
    info.name = "fake";
    info.params = {
        ParamSpec{"ratio", ParamSpec::Kind::kFloat, "0.01", 0.0, 1.0, true, {}, "fraction kept"},
        ParamSpec{"bits", ParamSpec::Kind::kInt, "4", 2, 8, false, {}, "bits per value"},
        ParamSpec{"ef", ParamSpec::Kind::kBool, "on", 0, 0, false, {}, "error feedback"},
        ParamSpec{"scale", ParamSpec::Kind::kChoice, "max", 0, 0, false, {"max", "l2"}, "bucket scale"},
        ParamSpec{"k", ParamSpec::Kind::kInt, "", 1, 1e12, false, {}, "absolute count"},
    };
    info.factory = [](const Params&) -> std::unique_ptr<Compressor> { return nullptr; };
    registry.add(info);
  }
  Registry registry;
};

TEST_F(SpecValidation, DefaultsFillIn) {
  const Params params = registry.validate("fake");
  EXPECT_DOUBLE_EQ(params.get_float("ratio"), 0.01);
  EXPECT_EQ(params.get_int("bits"), 4);
  EXPECT_TRUE(params.get_bool("ef"));
  EXPECT_EQ(params.get_string("scale"), "max");
  EXPECT_FALSE(params.has("k"));
  EXPECT_FALSE(params.given("ratio"));
}

TEST_F(SpecValidation, GivenValuesAreNormalized) {
  const Params params = registry.validate("fake:ef=false,bits=8,ratio=1e-3,k=100");
  EXPECT_FALSE(params.get_bool("ef"));
  EXPECT_EQ(params.get_string("ef"), "off");
  EXPECT_EQ(params.get_int("bits"), 8);
  EXPECT_DOUBLE_EQ(params.get_float("ratio"), 0.001);
  EXPECT_TRUE(params.given("k"));
  EXPECT_EQ(params.canonical(registry.info("fake").params), "fake:ratio=0.001,bits=8,ef=off,scale=max,k=100");
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const InvalidArgument& error) {
    return error.what();
  }
  return "";
}

TEST_F(SpecValidation, UnknownNameListsRegistered) {
  const auto message = error_of([&] { registry.validate("nope:ratio=0.1"); });
  EXPECT_NE(message.find("unknown compressor 'nope'"), std::string::npos) << message;
  EXPECT_NE(message.find("fake"), std::string::npos) << message;
}

TEST_F(SpecValidation, UnknownParameterListsValidOnes) {
  const auto message = error_of([&] { registry.validate("fake:ratoi=0.1"); });
  EXPECT_NE(message.find("no parameter 'ratoi'"), std::string::npos) << message;
  EXPECT_NE(message.find("ratio (float (0, 1], default 0.01)"), std::string::npos) << message;
}

TEST_F(SpecValidation, OutOfRangeAndUnparsableValues) {
  EXPECT_NE(error_of([&] { registry.validate("fake:ratio=0"); }).find("out of range"), std::string::npos);
  EXPECT_NE(error_of([&] { registry.validate("fake:ratio=1.5"); }).find("out of range"), std::string::npos);
  EXPECT_NO_THROW(registry.validate("fake:ratio=1"));
  EXPECT_NE(error_of([&] { registry.validate("fake:bits=1"); }).find("out of range"), std::string::npos);
  EXPECT_NE(error_of([&] { registry.validate("fake:bits=4.5"); }).find("not an integer"), std::string::npos);
  EXPECT_NE(error_of([&] { registry.validate("fake:ratio=abc"); }).find("not a number"), std::string::npos);
  EXPECT_NE(error_of([&] { registry.validate("fake:ratio=nan"); }).find("not a number"), std::string::npos);
  EXPECT_NE(error_of([&] { registry.validate("fake:ef=maybe"); }).find("not a boolean"), std::string::npos);
  EXPECT_NE(error_of([&] { registry.validate("fake:scale=l1"); }).find("max|l2"), std::string::npos);
}

}  // namespace
}  // namespace gradcomp

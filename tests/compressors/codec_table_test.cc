// One codec table, one parsed spec: the registry's kinds, payload ids and names, and the CUDA backends come from
// compressors/framework/codec_table.cc; a spec is parsed once into a CompressorSpec whose canonical string is the compressor's
// own spec(), and equivalent spellings are one spec.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "compressors/framework/codec_table.h"
#include "compressors/framework/payload.h"
#include "gradcomp/config.h"
#include "gradcomp/error.h"
#include "gradcomp/registry.h"

namespace gradcomp {
namespace {

TEST(CodecTable, EveryRowIsOneRegisteredKindWithItsOwnPayloadId) {
  std::set<std::string_view> names;
  std::set<payload::CodecId> ids;
  for (const CodecRow& row : builtin_codecs()) {
    EXPECT_TRUE(names.insert(row.name).second) << row.name;
    EXPECT_TRUE(ids.insert(row.id).second) << row.name;
    EXPECT_EQ(payload::codec_name(row.id), row.name);
    EXPECT_EQ(codec_row(row.id), &row);
    const CompressorInfo& info = default_registry().info(row.name);
    EXPECT_EQ(info.positional, row.positional) << row.name;
    if (!row.positional.empty()) {
      bool declared = false;
      for (const ParamSpec& param : info.params) declared = declared || param.name == row.positional;
      EXPECT_TRUE(declared) << row.name << ": positional parameter '" << row.positional << "' is not declared";
    }
    // Rounds codecs (powersgd) have no one-call CudaCodec: their device path is LowRankOps on CUDA.
    const bool has_backend = GRADCOMP_WITH_CUDA && !info.traits.rounds;
    EXPECT_EQ(row.cuda != nullptr, has_backend) << row.name;
  }
  EXPECT_EQ(default_registry().list().size(), builtin_codecs().size());
  EXPECT_EQ(payload::codec_name(payload::CodecId::kCustom), "custom");
  EXPECT_EQ(codec_row(payload::CodecId::kCustom), nullptr);
}

TEST(CompressorSpec, CanonicalIsTheCompressorsOwnSpec) {
  for (const CodecRow& row : builtin_codecs()) {
    for (const std::string& text : {std::string(row.name), std::string(row.name) + ":nonfinite=skip"}) {
      const CompressorSpec spec = default_registry().parse(text);
      EXPECT_EQ(spec.canonical, make_compressor(text)->spec()) << text;
      EXPECT_EQ(spec.name, row.name);
      EXPECT_EQ(default_registry().parse(spec.canonical), spec) << "the canonical string re-parses to itself";
      EXPECT_EQ(spec.traits.summable, default_registry().info(row.name).traits.summable);
    }
  }
}

TEST(CompressorSpec, EquivalentSpellingsAreOneSpec) {
  const Registry& registry = default_registry();
  EXPECT_EQ(registry.parse("topk"), registry.parse("topk:ratio=0.01"));
  EXPECT_EQ(registry.parse("topk"), registry.parse(" topk : ef=true , ratio=0.010 , values=f32"));
  EXPECT_EQ(registry.parse("qsgd"), registry.parse("qsgd:bits=4,bucket=512"));
  EXPECT_FALSE(registry.parse("topk") == registry.parse("topk:ratio=0.02"));
  const CompressorSpec by_k = registry.parse("topk:k=5");
  EXPECT_FALSE(by_k.params.has("ratio")) << by_k.canonical << ": k replaces ratio's default";
  EXPECT_EQ(by_k.canonical, make_compressor("topk:k=5")->spec());
  EXPECT_THROW(registry.parse("topk:k=5,ratio=0.1"), InvalidArgument);
  EXPECT_THROW(registry.parse("topk:rato=0.1"), InvalidArgument);
}

}  // namespace
}  // namespace gradcomp

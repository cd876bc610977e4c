#include <gtest/gtest.h>

#include "engine/stop_matcher.h"

using tandem::StopMatcher;

TEST(StopMatcher, MatchesAcrossChunksAndNeverEmitsTheStop) {
  StopMatcher m({"</end>", "STOP"});
  std::string out;
  for (const char* chunk : {"Hello wor", "ld </e", "nd> tail"}) out += m.push(chunk);
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(out, "Hello world ");
  EXPECT_EQ(m.matched(), "</end>");
  EXPECT_EQ(m.push("more"), "");
}

TEST(StopMatcher, HeldBackPrefixIsReleasedWhenRuledOut) {
  StopMatcher m({"STOP"});
  EXPECT_EQ(m.push("abc ST"), "abc ");
  EXPECT_EQ(m.push("O"), "");
  EXPECT_EQ(m.push("P!"), "");
  EXPECT_TRUE(m.stopped());
  StopMatcher n({"STOP"});
  EXPECT_EQ(n.push("ST"), "");
  EXPECT_EQ(n.push("OX"), "STOX");
  EXPECT_EQ(n.push("S"), "");
  EXPECT_EQ(n.flush(), "S");
  EXPECT_FALSE(n.stopped());
}

TEST(StopMatcher, EarliestStopWinsAndEmptyStopsAreIgnored) {
  StopMatcher m({"", "b c", "a b"});
  EXPECT_EQ(m.push("xa b c"), "x");
  EXPECT_EQ(m.matched(), "a b");
}

TEST(StopMatcher, OneCharacterAtATimeEqualsWhole) {
  const std::string text = "the cat sat on the mat; the end. trailing";
  for (const std::string stop : {"the end", "mat;", "zzz", "g"}) {
    StopMatcher whole({stop}), pieces({stop});
    std::string a = whole.push(text) + whole.flush(), b;
    for (char c : text) b += pieces.push(std::string(1, c));
    b += pieces.flush();
    EXPECT_EQ(a, b) << stop;
    EXPECT_EQ(whole.stopped(), pieces.stopped()) << stop;
  }
}

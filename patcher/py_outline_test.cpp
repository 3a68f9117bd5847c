#include "py_outline.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace patcher::py {
namespace {

using ::testing::ElementsAre;
using ::testing::UnorderedElementsAre;

const char* kModule = R"(from __future__ import annotations

import os
import numpy as np
from typing import TYPE_CHECKING
from . import sibling
from ..base import (
    Base,  # a comment inside the parentheses
    Other as Renamed,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig

try:
    from .fast import impl
except ImportError:
    impl = None

LIMIT: int = 4
a, b = 1, 2


@dataclass(frozen=True)
class Point(Base):
    x: int
    y: "int | None" = None
    ORIGIN = 0

    def __init__(
        self,
        x: int,  # the first
        *args,
        y: int = 0,
        **kw,
    ) -> None:
        self.x = x
        self.cache: dict[str, int] = {}
        self.a, self.b = 1, 2
        if x == 1:
            self.nested = 3

    @property
    def norm(self) -> float:
        return 0.0

    @staticmethod
    def make(v) -> "Point":
        return Point(v)


async def run(job_id: int, spec) -> tuple[int, int]:
    for i, (k, v) in enumerate(spec):
        pass
    with open(spec) as f:
        data = f.read()
    if (n := len(data)) > 1:
        pass
    return 1, 2
)";

Outline parse() { return outline(kModule, "pkg.sub.mod", false); }

TEST(PyOutline, ReadsImportsWithRelativeNamesAliasesAndGuardedBlocks) {
  Outline o = parse();
  const Def* base = find_def(o, "Base");
  ASSERT_TRUE(base);
  EXPECT_EQ(base->kind, DefKind::Import);
  EXPECT_EQ(base->from, "pkg.base");
  EXPECT_EQ(base->imported, "Base");
  const Def* renamed = find_def(o, "Renamed");
  ASSERT_TRUE(renamed);
  EXPECT_EQ(renamed->imported, "Other");
  EXPECT_EQ(find_def(o, "sibling")->from, "pkg.sub");
  EXPECT_EQ(find_def(o, "np")->from, "numpy");
  EXPECT_EQ(find_def(o, "VllmConfig")->from, "vllm.config");  // under TYPE_CHECKING
  EXPECT_TRUE(find_def(o, "impl"));                            // try and except both bind it
}

TEST(PyOutline, ReadsTopLevelAssignmentsClassesAndFunctions) {
  Outline o = parse();
  const Def* limit = find_def(o, "LIMIT");
  ASSERT_TRUE(limit);
  EXPECT_TRUE(limit->annotated);
  EXPECT_EQ(limit->annotation, "int");
  EXPECT_TRUE(find_def(o, "a"));
  EXPECT_TRUE(find_def(o, "b"));
  const Def* point = find_def(o, "Point");
  ASSERT_TRUE(point);
  EXPECT_EQ(point->kind, DefKind::Class);
  EXPECT_THAT(point->bases, ElementsAre("Base"));
  EXPECT_THAT(point->decorators, ElementsAre("dataclass(frozen=True)"));
  const Def* run = find_def(o, "run");
  ASSERT_TRUE(run);
  EXPECT_EQ(run->kind, DefKind::Function);
  EXPECT_THAT(run->params, ElementsAre("job_id", "spec"));
  EXPECT_EQ(run->annotation, "tuple[int, int]");
}

TEST(PyOutline, ReadsClassMembersAndWhatMethodsAssignToSelf) {
  Outline o = parse();
  std::vector<Def> ms = members(o, *find_def(o, "Point"));
  std::vector<std::string> names;
  for (const auto& d : ms) names.push_back(d.name);
  EXPECT_THAT(names, UnorderedElementsAre("x", "y", "ORIGIN", "__init__", "norm", "make", "x", "cache", "a", "b",
                                          "nested"));
  const Def& init = *std::find_if(ms.begin(), ms.end(), [](auto& d) { return d.name == "__init__"; });
  EXPECT_THAT(init.params, ElementsAre("self", "x", "*args", "y", "**kw"));
  EXPECT_EQ(init.annotation, "None");
  const Def& y = *std::find_if(ms.begin(), ms.end(), [](auto& d) { return d.name == "y"; });
  EXPECT_EQ(y.annotation, "\"int | None\"");
  EXPECT_EQ(normal_annotation(y.annotation), "int|None");
  const Def& cache = *std::find_if(ms.begin(), ms.end(), [](auto& d) { return d.name == "cache"; });
  EXPECT_EQ(cache.annotation, "dict[str, int]");
  const Def& norm = *std::find_if(ms.begin(), ms.end(), [](auto& d) { return d.name == "norm"; });
  EXPECT_THAT(norm.decorators, ElementsAre("property"));
  EXPECT_EQ(norm.annotation, "float");
}

TEST(PyOutline, KnowsWhatAFunctionBinds) {
  Outline o = parse();
  size_t run = find_def(o, "run")->line;
  for (const char* n : {"job_id", "spec", "i", "k", "v", "f", "data", "n"}) EXPECT_TRUE(binds(o, run, n)) << n;
  EXPECT_FALSE(binds(o, run, "enumerate"));
  EXPECT_FALSE(binds(o, run, "Point"));
}

TEST(PyOutline, HasWordMatchesWholeIdentifiersOnly) {
  EXPECT_TRUE(has_word("self.x: Handler = make()", "Handler"));
  EXPECT_FALSE(has_word("self.x: HandlerV2 = make()", "Handler"));
  EXPECT_FALSE(has_word("self.x = my_Handler", "Handler"));
}

}  // namespace
}  // namespace patcher::py

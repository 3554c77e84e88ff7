// What the kernel image watch knows (csrc/core/module_image_registry.h): images by module and
// library while every way one goes is seen, nothing from a watch that did not start or stopped,
// and stored images loaded back named whatever the watch does.
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "core/module_image_registry.h"

using grape::core::Blob;
using grape::core::ModuleImageRegistry;

namespace {

constexpr bool kModule = false, kLibrary = true;
const Blob kImage(100, 7);

// A registry whose watch runs, with nothing learned.
ModuleImageRegistry watching(size_t max_kept_bytes = 1 << 20) {
  ModuleImageRegistry r(max_kept_bytes);
  r.started("");
  return r;
}

// The driver's answer for a library's module: library L's module is L + 1000.
std::optional<uint64_t> module_of(uint64_t library) { return library + 1000; }

std::optional<uint64_t> no_module(uint64_t) { return std::nullopt; }

}  // namespace

TEST(ModuleImageRegistry, NamesTheImagesOfModulesAndLibrariesLoadedWhileWatching) {
  ModuleImageRegistry r = watching();
  r.loaded(kModule, 1, 0xAA, kImage.data(), kImage.size());
  r.loaded(kLibrary, 2, 0xBB, kImage.data(), 50);
  EXPECT_EQ(r.module_image(1, module_of), 0xAAu);
  EXPECT_EQ(r.library_image(2), 0xBBu);
  EXPECT_EQ(r.module_image(1002, module_of), 0xBBu);  // the library's module, asked of the driver
  EXPECT_FALSE(r.module_image(3, module_of));
  EXPECT_EQ(r.image(0xAA), kImage);
  EXPECT_EQ(r.image(0xBB), Blob(kImage.begin(), kImage.begin() + 50));
  const auto counts = r.counts();
  EXPECT_TRUE(counts.watching);
  EXPECT_EQ(counts.why_not, "");
  EXPECT_EQ(counts.seen, 2u);
  EXPECT_EQ(counts.kept_bytes, 150u);
}

TEST(ModuleImageRegistry, AsksTheDriverForEachLibrarysModuleOnce) {
  ModuleImageRegistry r = watching();
  r.loaded(kLibrary, 2, 0xBB, kImage.data(), kImage.size());
  int asked = 0;
  auto counting = [&asked](uint64_t library) -> std::optional<uint64_t> {
    ++asked;
    return library + 1000;
  };
  EXPECT_EQ(r.module_image(1002, counting), 0xBBu);
  EXPECT_EQ(r.module_image(1002, counting), 0xBBu);
  EXPECT_EQ(asked, 1);
  r.loaded(kLibrary, 4, 0xDD, kImage.data(), kImage.size());
  EXPECT_EQ(r.module_image(1004, counting), 0xDDu);
  EXPECT_EQ(asked, 2);
  r.context_ended();  // the libraries stay, their modules were the context's: asked again
  EXPECT_EQ(r.module_image(1002, counting), 0xBBu);
  EXPECT_EQ(asked, 4);
}

TEST(ModuleImageRegistry, AnUnloadedOrEndedHandleNamesNothingThatCameBefore) {
  ModuleImageRegistry r = watching();
  r.loaded(kModule, 1, 0xAA, kImage.data(), kImage.size());
  r.loaded(kLibrary, 2, 0xBB, kImage.data(), kImage.size());
  ASSERT_EQ(r.module_image(1002, module_of), 0xBBu);
  r.unloaded(kModule, 1);
  r.unloaded(kLibrary, 2);
  EXPECT_FALSE(r.module_image(1, module_of));
  EXPECT_FALSE(r.library_image(2));
  EXPECT_FALSE(r.module_image(1002, module_of));  // the library's module went with it
  r.loaded(kModule, 5, 0xEE, kImage.data(), kImage.size());
  r.context_ended();  // its modules go without unload calls
  EXPECT_FALSE(r.module_image(5, module_of));
  EXPECT_TRUE(r.image(0xEE));  // bytes are kept by digest: a later load of them is the same code
}

TEST(ModuleImageRegistry, AWatchThatDidNotStartNamesNothingItsCallbacksSaw) {
  ModuleImageRegistry r(1 << 20);
  r.loaded(kModule, 1, 0xAA, kImage.data(), kImage.size());  // before a start that then failed
  r.started("cuptiEnableCallback failed: ?");
  EXPECT_FALSE(r.watching());
  EXPECT_FALSE(r.module_image(1, module_of));
  EXPECT_EQ(r.counts().why_not, "cuptiEnableCallback failed: ?");
  r.started("");  // a later start that runs trusts nothing the failed one saw
  EXPECT_FALSE(r.module_image(1, module_of));
  ModuleImageRegistry never(1 << 20);
  EXPECT_EQ(never.counts().why_not, "never asked");
}

TEST(ModuleImageRegistry, AStoppedWatchForgetsLearnsNothingMoreAndDropsItsImages) {
  ModuleImageRegistry r = watching();
  r.loaded(kModule, 1, 0xAA, kImage.data(), kImage.size());
  r.stop("stopped: a profiler");
  EXPECT_TRUE(r.stopped());
  EXPECT_FALSE(r.watching());
  EXPECT_FALSE(r.module_image(1, module_of));
  EXPECT_FALSE(r.image(0xAA));
  r.loaded(kModule, 6, 0xFF, kImage.data(), kImage.size());  // a callback still in flight
  r.unloaded(kModule, 6);
  r.context_ended();
  EXPECT_FALSE(r.module_image(6, module_of));
  EXPECT_FALSE(r.image(0xFF));
  const auto counts = r.counts();
  EXPECT_EQ(counts.why_not, "stopped: a profiler");
  EXPECT_EQ(counts.kept_bytes, 0u);
  EXPECT_EQ(counts.seen, 1u);
}

TEST(ModuleImageRegistry, StoredImagesLoadedBackNameTheirKernelsWithOrWithoutTheWatch) {
  ModuleImageRegistry r(1 << 20);  // no watch at all
  EXPECT_FALSE(r.loaded_library(0xAA));
  EXPECT_EQ(r.loaded_back(0xAA, 20, uint64_t{21}), 20u);
  EXPECT_EQ(r.loaded_back(0xAA, 30, std::nullopt), 20u);  // another thread's load: the first kept
  EXPECT_EQ(r.loaded_library(0xAA), 20u);
  EXPECT_EQ(r.library_image(20), 0xAAu);
  EXPECT_FALSE(r.library_image(30));  // the other copy hands out no kernel
  EXPECT_EQ(r.module_image(21, no_module), 0xAAu);
  EXPECT_EQ(r.counts().loaded, 1u);
  r.stop("stopped");
  EXPECT_EQ(r.library_image(20), 0xAAu);
  EXPECT_EQ(r.module_image(21, no_module), 0xAAu);
  r.context_ended();  // the module was that context's; the library is not
  EXPECT_FALSE(r.module_image(21, no_module));
  EXPECT_EQ(r.library_image(20), 0xAAu);
}

TEST(ModuleImageRegistry, ImagesAreKeptOncePerDigestUpToTheCap) {
  ModuleImageRegistry r = watching(/*max_kept_bytes=*/250);
  r.loaded(kModule, 1, 0xAA, kImage.data(), kImage.size());
  r.loaded(kModule, 3, 0xAA, kImage.data(), kImage.size());  // kept once by digest
  EXPECT_EQ(r.counts().kept_bytes, 100u);
  const Blob larger(150, 9);
  r.loaded(kModule, 4, 0xCC, larger.data(), larger.size());  // up to the cap exactly: kept
  EXPECT_EQ(r.counts().kept_bytes, 250u);
  r.loaded(kModule, 2, 0xBB, kImage.data(), 1);  // past it: named, not kept
  EXPECT_EQ(r.module_image(2, no_module), 0xBBu);
  EXPECT_TRUE(r.image(0xAA) && r.image(0xCC));
  EXPECT_FALSE(r.image(0xBB));
  EXPECT_EQ(r.counts().kept_bytes, 250u);
  EXPECT_EQ(r.counts().seen, 4u);
}

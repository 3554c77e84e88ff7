#include "core/kernel_images.h"

#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "core/param_codec.h"

namespace grape::core {
namespace {

constexpr char kMark[] = "@image:";
constexpr size_t kMarkSize = sizeof(kMark) - 1;
constexpr size_t kDigestDigits = 16;

template <typename T>
T read_at(const uint8_t* image, size_t at) {
  T value;
  std::memcpy(&value, image + at, sizeof value);
  return value;
}

// A 64-bit little-endian ELF object's extent: its header, both header tables, and every
// section's contents (sh_type 8, NOBITS, has none in the file).
std::optional<size_t> elf_length(const uint8_t* image, size_t limit) {
  constexpr size_t kHeader = 64, kSectionHeader = 64, kProgramHeader = 56;
  if (image[4] != 2 || image[5] != 1) return std::nullopt;  // ELFCLASS64, little-endian
  // A relocatable object (e_type 1) marks sections without file bytes by NVIDIA's own types
  // too; the driver loads executables, whose extent the standard types give.
  if (read_at<uint16_t>(image, 0x10) == 1) return std::nullopt;
  const uint64_t program_at = read_at<uint64_t>(image, 0x20);
  const uint64_t sections_at = read_at<uint64_t>(image, 0x28);
  const uint16_t program_entry = read_at<uint16_t>(image, 0x36);
  const uint16_t programs = read_at<uint16_t>(image, 0x38);
  const uint16_t section_entry = read_at<uint16_t>(image, 0x3A);
  const uint16_t sections = read_at<uint16_t>(image, 0x3C);
  // No sections (or extended numbering, which keeps the count elsewhere): a length from the
  // headers alone could leave code out of the digest.
  if (sections == 0 || section_entry != kSectionHeader) return std::nullopt;
  if (programs > 0 && program_entry != kProgramHeader) return std::nullopt;
  uint64_t end = kHeader;
  const auto reach = [&end, limit](uint64_t at, uint64_t size) {
    if (at > limit || size > limit - at) return false;
    end = std::max(end, at + size);
    return true;
  };
  if (!reach(program_at, uint64_t{program_entry} * programs) ||
      !reach(sections_at, uint64_t{kSectionHeader} * sections)) {
    return std::nullopt;
  }
  for (uint16_t i = 0; i < programs; ++i) {  // a segment's bytes in the file
    const uint8_t* header = image + program_at + i * kProgramHeader;
    if (!reach(read_at<uint64_t>(header, 8), read_at<uint64_t>(header, 0x20))) {
      return std::nullopt;
    }
  }
  for (uint16_t i = 0; i < sections; ++i) {
    const uint8_t* header = image + sections_at + i * kSectionHeader;
    if (read_at<uint32_t>(header, 4) == 8) continue;
    if (!reach(read_at<uint64_t>(header, 0x18), read_at<uint64_t>(header, 0x20))) {
      return std::nullopt;
    }
  }
  return static_cast<size_t>(end);
}

}  // namespace

std::string with_image(const std::string& kernel_name, uint64_t digest) {
  char digits[kDigestDigits + 1];
  std::snprintf(digits, sizeof digits, "%016" PRIx64, digest);
  return kernel_name + kMark + digits;
}

std::optional<uint64_t> image_of(const std::string& kernel_name) {
  if (kernel_name.size() < kMarkSize + kDigestDigits) return std::nullopt;
  const size_t at = kernel_name.size() - kMarkSize - kDigestDigits;
  if (kernel_name.compare(at, kMarkSize, kMark) != 0) return std::nullopt;
  uint64_t digest = 0;
  for (size_t i = at + kMarkSize; i < kernel_name.size(); ++i) {
    const char c = kernel_name[i];
    const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (digit < 0) return std::nullopt;
    digest = digest << 4 | static_cast<uint64_t>(digit);
  }
  return digest;
}

std::string without_image(const std::string& kernel_name) {
  return image_of(kernel_name)
             ? kernel_name.substr(0, kernel_name.size() - kMarkSize - kDigestDigits)
             : kernel_name;
}

std::optional<size_t> image_length(const uint8_t* image, size_t limit) {
  if (image == nullptr) return std::nullopt;
  if (std::memcmp(image, "\x7f" "ELF", 4) == 0) return elf_length(image, limit);
  constexpr uint32_t kFatbinMagic = 0xBA55ED50;
  if (read_at<uint32_t>(image, 0) == kFatbinMagic) {
    const uint16_t header = read_at<uint16_t>(image, 6);
    const uint64_t body = read_at<uint64_t>(image, 8);
    if (header < 16 || header > limit || body > limit - header) return std::nullopt;
    return static_cast<size_t>(header + body);
  }
  return std::nullopt;
}

uint64_t image_digest(const uint8_t* image, size_t size) { return hash_bytes(0, image, size); }

}  // namespace grape::core

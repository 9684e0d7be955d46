// SHA-256 against FIPS 180-4's examples (NIST CSRC "SHA256.pdf" and the
// one-million-'a' message), and any split of a message into updates.
#include <gtest/gtest.h>

#include <random>

#include "support/sha256.h"

namespace kiln {
namespace {

TEST(Sha256, NistExamples) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256_hex(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, SplitUpdatesGiveTheSameDigest) {
  std::mt19937 rng(7);
  // Lengths around the 55/56/64-byte padding boundaries and beyond.
  for (size_t len : {0, 1, 55, 56, 57, 63, 64, 65, 119, 120, 128, 1000}) {
    std::string msg(len, '\0');
    for (char& c : msg) c = static_cast<char>(rng() & 0xff);
    const std::string whole = sha256_hex(msg);
    for (int trial = 0; trial < 8; ++trial) {
      Sha256 s;
      size_t at = 0;
      while (at < len) {
        size_t take = std::min<size_t>(len - at, rng() % 70);
        s.update(msg.data() + at, take);
        at += take;
      }
      std::string hex;
      for (uint8_t b : s.finish()) {
        static const char* kHex = "0123456789abcdef";
        hex += kHex[b >> 4];
        hex += kHex[b & 15];
      }
      EXPECT_EQ(hex, whole) << "length " << len;
    }
  }
}

}  // namespace
}  // namespace kiln

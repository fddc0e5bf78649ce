// gguf_from_llama2c CHECKPOINT TOKENIZER TYPE OUT: a llama2.c checkpoint as the GGUF file llama.cpp's converter
// lays out, its matrices and embedding in ggml type TYPE (0 F32, 1 F16, 30 BF16, 8 Q8_0, 2 Q4_0, 12 Q4_K,
// 14 Q6_K ...; tests/support/ggml_quants.h, whose scales are chosen simply, not by llama-quantize's search).
// For scripts/bench-gguf-load.sh: files of every type from one generated model, no llama.cpp needed. TYPE
// llama2c-v1 or llama2c-v2 writes llama2.c's export.py --version 1 or 2 file instead (TOKENIZER unused).
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "tests/support/gguf_writer.h"
#include "tests/support/llama2c_export.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: gguf_from_llama2c CHECKPOINT TOKENIZER TYPE OUT\n");
    return 2;
  }
  try {
    const std::string kind = argv[3];
    if (kind == "llama2c-v1" || kind == "llama2c-v2") {
      shardline::test::write_llama2c_export(argv[1], argv[4], {.version = kind == "llama2c-v1" ? 1 : 2});
      return 0;
    }
    const auto type = static_cast<std::uint32_t>(std::strtoul(argv[3], nullptr, 10));
    shardline::test::llama_gguf_from_llama2c(argv[1], argv[2], {.matrix_type = type}).write(argv[4]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gguf_from_llama2c: %s\n", e.what());
    return 1;
  }
  return 0;
}

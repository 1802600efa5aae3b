# The libraries below LibTorch that the parsers and the tokenizer link, found the same way by the
# main build (CMakeLists.txt) and the fuzz project (fuzz/CMakeLists.txt): JSON, logging, the flag
# parser, SentencePiece; for tokenizer.json, regexes through PCRE2 (UTF + Unicode properties) and
# NFC/NFKC through utf8proc; XXH3 digests of checkpoint files (ckpt/digest.cpp: near memory
# speed, Debian's libxxhash); YAML config files through libyaml.
find_package(nlohmann_json REQUIRED)
find_package(spdlog REQUIRED)
find_package(CLI11 CONFIG REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(SENTENCEPIECE REQUIRED IMPORTED_TARGET sentencepiece)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
pkg_check_modules(UTF8PROC REQUIRED IMPORTED_TARGET libutf8proc)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)
# --config *.yaml (TRL's recipes): libyaml, the parser PyYAML binds (cli/yaml_config.cpp).
pkg_check_modules(YAML REQUIRED IMPORTED_TARGET yaml-0.1)
